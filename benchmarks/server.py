"""Loopback HTTP file server for the benchmark: Range support, no sendfile, optional throttle.

nginx with `sendfile on` is anomalously slow on this kernel (perf-baselines T1a), so the files
are read with pread in 4 MiB pieces and written to the socket, as nginx does with `sendfile
off`. `/slow/<name>` serves the same file limited to a fixed rate per response; an HTTP/1.1
connection carries one response at a time, so this is a per-connection limit like nginx's
`limit_rate`, which is what issue 4's throttled parallel-ranges row needs.

Run it as its own process (`python -m benchmarks.server --root DIR`) so that it never competes
for the harness's GIL; it prints `PORT <n>` once it listens. `ServerProcess` does exactly that.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from aiohttp import web

CHUNK = 4 << 20

ROOT_KEY = web.AppKey("root", Path)
RATE_KEY = web.AppKey("rate", int)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Parse a single `bytes=` range into [start, stop); None for the whole file.

    Raises ValueError for a range that cannot be satisfied (416). Multi-range requests are
    answered with the first range only, which is all our clients ask for.
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or not spec:
        raise ValueError(header)
    first = spec.split(",")[0].strip()
    a, _, b = first.partition("-")
    if a == "":
        n = int(b)
        if n <= 0:
            raise ValueError(header)
        return max(0, size - n), size
    start = int(a)
    stop = size if b == "" else min(size, int(b) + 1)
    if start >= size or stop <= start:
        raise ValueError(header)
    return start, stop


async def _send(resp: web.StreamResponse, fd: int, start: int, stop: int, rate: int) -> None:
    """Send [start, stop); with a rate, each piece (1/100 s worth) waits for its turn
    *before* it is written, so a response bursts at most one piece. (Sleeping after each
    write let every new response's first 12.5 MB out at full speed, which rewarded opening
    a new connection per range request over reusing a kept-alive one.)"""
    loop = asyncio.get_running_loop()
    piece = CHUNK if rate <= 0 else max(64 << 10, min(CHUNK, rate // 100))
    t0 = time.monotonic()
    sent = 0
    pos = start
    while pos < stop:
        if rate > 0:
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        data = await loop.run_in_executor(None, os.pread, fd, min(piece, stop - pos), pos)
        if not data:
            break
        await resp.write(data)
        pos += len(data)
        sent += len(data)


async def serve_file(request: web.Request) -> web.StreamResponse:
    root: Path = request.app[ROOT_KEY]
    name = request.match_info["name"]
    if "/" in name or name.startswith("."):
        raise web.HTTPNotFound()
    path = root / name
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise web.HTTPNotFound() from None
    try:
        st = os.fstat(fd)
        size = st.st_size
        headers = {
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            "ETag": f'"{st.st_ino:x}-{size:x}-{int(st.st_mtime):x}"',
        }
        try:
            rng = parse_range(request.headers.get("Range"), size)
        except ValueError:
            raise web.HTTPRequestRangeNotSatisfiable(
                headers={"Content-Range": f"bytes */{size}"}
            ) from None
        start, stop = rng if rng else (0, size)
        if rng:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        headers["Content-Length"] = str(stop - start)
        resp = web.StreamResponse(status=206 if rng else 200, headers=headers)
        await resp.prepare(request)
        if request.method != "HEAD":
            rate = request.app[RATE_KEY] if request.path.startswith("/slow/") else 0
            await _send(resp, fd, start, stop, rate)
        await resp.write_eof()
        return resp
    finally:
        os.close(fd)


def make_app(root: Path, rate: int) -> web.Application:
    """The application: `/<name>` at full speed and `/slow/<name>` at `rate` bytes/s."""
    app = web.Application()
    app[ROOT_KEY] = root
    app[RATE_KEY] = rate
    app.router.add_get("/{name}", serve_file)  # add_get answers HEAD too
    app.router.add_get("/slow/{name}", serve_file)
    return app


async def _serve(root: Path, port: int, rate: int) -> None:
    runner = web.AppRunner(make_app(root, rate), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=128)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate", type=int, default=0, help="bytes/s per /slow/ response")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(args.root, args.port, args.rate))
    except KeyboardInterrupt:
        pass


class ServerProcess:
    """Start the server in a child process for the duration of a `with` block."""

    def __init__(self, root: Path, rate: int, port: int = 0) -> None:
        self._argv = [
            sys.executable,
            "-m",
            "benchmarks.server",
            "--root",
            str(root),
            "--port",
            str(port),
            "--rate",
            str(rate),
        ]
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> ServerProcess:
        repo = Path(__file__).resolve().parent.parent
        self._proc = subprocess.Popen(
            self._argv,
            cwd=repo,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(repo)},
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self._proc.kill()
            raise RuntimeError(f"benchmark server failed to start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def url(self, name: str, *, throttled: bool = False) -> str:
        return f"http://127.0.0.1:{self.port}/{'slow/' if throttled else ''}{name}"


if __name__ == "__main__":
    main()
