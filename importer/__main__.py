"""Entry point of the import pod: ``python -m importer`` with CDI's environment variables.

Whatever goes wrong, the pod ends with a typed termination message (``importer.failure``):
a bad environment, a typed import failure, or a bug (``InternalError``, no exception text).

``python -m importer install-holder DEST`` is the node-pull pod's init container: it copies the
static ``cdi-holder`` from this image into the shared emptyDir (``importer.holder``). In a
node-pull pod the import itself holds the importer lock while it runs and says ``done`` at the
end, however it ends, so the containerDisk container exits and the pod completes.

With ``IMPORTER_SIZE_DETECTION_PATH`` set, the pod measures that image instead of importing
(a clone's size detection, ``importer.size_detection``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from cdi.api.constants import ImporterEnv
from cdi.api.termination import TerminationMessage
from importer.config import TERMINATION_PATH, from_env, node_pull_dir
from importer.failure import guarded
from importer.holder import (
    HOLDER_BINARY,
    HOLDER_BINARY_ENV,
    ImporterLock,
    install_holder,
    signal_done,
)
from importer.runner import run_import, tune_process_memory
from importer.size_detection import detect_size

log = logging.getLogger("importer")


async def _import(env: dict[str, str]) -> TerminationMessage:
    return await run_import(from_env(env))


async def _measure(image: str, termination_path: str) -> TerminationMessage:
    message = await detect_size(image)
    message.write(termination_path)
    return message


@contextlib.contextmanager
def holder_session(shared_dir: str | None) -> Iterator[None]:
    """For a node pull: hold the importer lock while importing, then tell the holder to go."""
    lock = None
    if shared_dir:
        try:
            lock = ImporterLock(shared_dir)
        except OSError as exc:
            log.warning("node pull: cannot take the importer lock: %s", exc.strerror)
    try:
        yield
    finally:
        if shared_dir:
            try:
                signal_done(shared_dir)
            except OSError as exc:
                log.warning("node pull: cannot write the done file: %s", exc.strerror)
        if lock is not None:
            lock.release()


def _install_holder(args: list[str], env: dict[str, str]) -> int:
    if len(args) != 1:
        print("usage: python -m importer install-holder DEST", file=sys.stderr)
        return 2
    try:
        install_holder(env.get(HOLDER_BINARY_ENV) or HOLDER_BINARY, args[0])
    except OSError as exc:
        print(f"cannot install the containerDisk holder: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)
    if args[:1] == ["install-holder"]:
        return _install_holder(args[1:], env)
    tune_process_memory()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    path = env.get("IMPORTER_TERMINATION_PATH", TERMINATION_PATH)
    measured = env.get(ImporterEnv.SIZE_DETECTION_PATH)
    if measured:  # a clone's size detection, not an import (importer/size_detection.py)
        message = asyncio.run(guarded(lambda: _measure(measured, path), path, log))
        return _report(message)
    with holder_session(node_pull_dir(env)):
        message = asyncio.run(guarded(lambda: _import(env), path, log))
    return _report(message)


def _report(message: TerminationMessage) -> int:
    print(message.to_json())
    if not message.succeeded:
        print(f"{message.reason}: {message.message}", file=sys.stderr)
    return 0 if message.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
