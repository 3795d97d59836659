"""Entry point of the clone source pod: ``python -m cloner`` with CDI's environment.

Whatever happens, the pod ends with a typed termination message (``cdi.api.termination``):
"Clone Complete" with the bytes sent, or the ``WorkerError``'s reason; anything else is an
``InternalError`` with a fixed message (the traceback goes to the log only). While it sends,
the clone's progress is served for the controller's scrape when asked (``CLONER_METRICS_PORT``);
a port that cannot be bound costs the progress display, never the clone.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from cdi.api.errors import InternalError, WorkerError
from cdi.api.termination import REASON_COMPLETED, TerminationMessage
from cloner.config import TERMINATION_PATH, CloneConfig, from_env
from cloner.reader import Payload, open_source
from cloner.sender import send

log = logging.getLogger("cloner")


def run(env: dict[str, str]) -> tuple[TerminationMessage, str | None]:
    started = time.monotonic()
    path: str | None = env.get("CLONER_TERMINATION_PATH", TERMINATION_PATH)
    try:
        config = from_env(env)
        path = config.termination_path
        payload = open_source(config.mount_point, config.block, config.raw)
        _serve_progress(config, payload)
        payload.progress.phase = "Transferring"
        sent = send(config, payload)
        payload.progress.phase = "Complete"
    except WorkerError as exc:
        return TerminationMessage(exc.reason, exc.message, transient=exc.transient), path
    except Exception:
        log.exception("clone source failed")
        error = InternalError("the clone source failed unexpectedly")
        return TerminationMessage(error.reason, error.message, transient=True), path
    labels = {"ownerUID": config.owner_uid} if config.owner_uid else {}
    message = TerminationMessage(
        REASON_COMPLETED,
        "Clone Complete",
        bytes_read=sent.bytes_sent,
        duration_seconds=round(time.monotonic() - started, 3),
        labels=labels,
    )
    return message, path


def _serve_progress(config: CloneConfig, payload: Payload) -> None:
    if config.metrics_port is None:
        return
    from prometheus_client import CollectorRegistry

    from datapath.metrics import ProgressCollector  # prometheus_client: only when served
    from datapath.metrics_server import start_metrics_server

    registry = CollectorRegistry()
    registry.register(ProgressCollector(payload.progress, config.owner_uid, kind="clone"))
    try:
        start_metrics_server(registry, config.metrics_addr, config.metrics_port)
    except OSError as exc:
        log.warning("cannot serve the clone's progress on port %d: %s", config.metrics_port, exc)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    message, path = run(dict(os.environ))
    if path:
        try:
            message.write(path)
        except OSError as exc:
            log.warning("cannot write the termination message to %s: %s", path, exc)
    print(message.to_json())
    return 0 if message.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
