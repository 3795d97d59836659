"""How an import looks on the terminal: a progress bar while it runs, then its result (or the
termination message as JSON). Shared by ``cdi import`` (``main.py``) and ``cdi demo``
(``demo.py``), so neither imports the other.
"""

from __future__ import annotations

import asyncio

from cdi.api.termination import TerminationMessage
from datapath import Progress
from importer.config import ImportConfig
from importer.runner import run_import


async def with_progress(config: ImportConfig, show: bool) -> TerminationMessage:
    progress = Progress()
    if not show:
        return await run_import(config, progress)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as Bar

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Bar(*columns, transient=False) as bar:
        task = bar.add_task("import", total=None)
        job = asyncio.ensure_future(run_import(config, progress))
        while not job.done():
            bar.update(
                task, completed=progress.done, total=progress.total, description=progress.phase
            )
            await asyncio.wait({job}, timeout=0.2)
        bar.update(
            task,
            completed=progress.done,
            total=progress.total or progress.done,
            description=progress.phase,
        )
        return job.result()


def print_result(message: TerminationMessage, as_json: bool) -> None:
    if as_json:
        print(message.to_json())
        return
    status = "OK" if message.succeeded else f"FAILED ({message.reason})"
    print(f"{status}: {message.message}")
    print(f"  format:        {' -> '.join(message.format_chain) or '-'}")
    print(f"  bytes read:    {message.bytes_read:,}")
    print(f"  bytes written: {message.bytes_written:,}")
    print(f"  virtual size:  {message.virtual_size:,}")
    print(f"  checksum:      {message.checksum or '-'}")
    print(f"  time:          {message.duration_seconds:.2f} s")
