"""Entry point of the import pod: ``python -m importer`` with CDI's environment variables."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from cdi.api.errors import WorkerError
from cdi.api.termination import TerminationMessage
from importer.config import TERMINATION_PATH, from_env
from importer.runner import run_import, tune_process_memory


def main() -> int:
    tune_process_memory()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = from_env(os.environ)
    except WorkerError as exc:
        path = os.environ.get("IMPORTER_TERMINATION_PATH", TERMINATION_PATH)
        TerminationMessage(reason=exc.reason, message=exc.message).write(path)
        print(f"{exc.reason}: {exc.message}", file=sys.stderr)
        return 1
    message = asyncio.run(run_import(config))
    print(message.to_json())
    return 0 if message.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
