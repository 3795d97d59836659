"""Entry point of the import pod: ``python -m importer`` with CDI's environment variables.

Whatever goes wrong, the pod ends with a typed termination message (``importer.failure``):
a bad environment, a typed import failure, or a bug (``InternalError``, no exception text).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from cdi.api.termination import TerminationMessage
from importer.config import TERMINATION_PATH, from_env
from importer.failure import guarded
from importer.runner import run_import, tune_process_memory

log = logging.getLogger("importer")


async def _import(env: dict[str, str]) -> TerminationMessage:
    return await run_import(from_env(env))


def main() -> int:
    tune_process_memory()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = dict(os.environ)
    path = env.get("IMPORTER_TERMINATION_PATH", TERMINATION_PATH)
    message = asyncio.run(guarded(lambda: _import(env), path, log))
    print(message.to_json())
    if not message.succeeded:
        print(f"{message.reason}: {message.message}", file=sys.stderr)
    return 0 if message.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
