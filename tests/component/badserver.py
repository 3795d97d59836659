"""An aiohttp file server on loopback that can misbehave in every way a real one does.

The first path segment picks the behaviour, the rest names a file in the served directory:
``/ok/disk.qcow2``, ``/nohead/...``, ``/cut/...`` and so on (see ``BEHAVIOURS``). Each request
is recorded so tests can assert what the importer actually asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import encode_basic_auth, hdrs, web

CHUNK = 1 << 20


@dataclass
class Recorder:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, range
    peers: list[int] = field(default_factory=list)  # client port of each request: its connection
    counters: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str) -> int:
        self.counters[key] = self.counters.get(key, 0) + 1
        return self.counters[key]


def _parse_range(header: str | None, size: int) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    start = header[6:].split("-", 1)[0]
    return int(start) if start else 0


def _range_end(header: str | None, size: int) -> int:
    """Exclusive end of a ``bytes=a-b`` request (``size`` when open-ended)."""
    if not header or not header.startswith("bytes="):
        return size
    end = header[6:].split("-", 1)[1]
    return min(size, int(end) + 1) if end else size


async def _send(
    request: web.Request,
    path: Path,
    *,
    ranges: bool = True,
    length: bool = True,
    content_type: str = "application/octet-stream",
    cut_at: int | None = None,
    status: int = 200,
    delay: float = 0.0,
) -> web.StreamResponse:
    size = path.stat().st_size
    header = request.headers.get(hdrs.RANGE) if ranges else None
    start, end = _parse_range(header, size), _range_end(header, size)
    resp = web.StreamResponse(status=206 if header else status)
    resp.content_type = content_type
    if ranges:
        resp.headers["Accept-Ranges"] = "bytes"
    if header:
        resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if length:
        resp.content_length = end - start
    else:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    sent = start
    with open(path, "rb") as fh:
        fh.seek(start)
        while sent < end and (chunk := fh.read(min(CHUNK, end - sent))):
            if cut_at is not None and sent + len(chunk) > cut_at:
                await resp.write(chunk[: cut_at - sent])
                assert request.transport is not None
                request.transport.abort()  # the connection dies mid-body
                return resp
            await resp.write(chunk)
            sent += len(chunk)
            if delay:
                await asyncio.sleep(delay)
    await resp.write_eof()
    return resp


HTML_PAGE = (
    b"<!DOCTYPE html><html><head><title>Error</title></head><body>"
    + b"Oops " * 400
    + b"</body></html>"
)


def make_app(root: Path, rec: Recorder) -> web.Application:
    def file_of(request: web.Request) -> Path:
        path = root / request.match_info["name"]
        if not path.is_file():
            raise web.HTTPNotFound(
                text="<html><body>404 not here</body></html>", content_type="text/html"
            )
        return path

    async def handler(request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        rec.requests.append((request.method, request.path, request.headers.get(hdrs.RANGE)))
        peer = request.transport.get_extra_info("peername") if request.transport else None
        rec.peers.append(peer[1] if peer else -1)
        behaviour = BEHAVIOURS.get(mode)
        if behaviour is None:
            raise web.HTTPNotFound()
        return await behaviour(request, file_of, rec)

    app = web.Application()
    app.router.add_route("*", "/{mode}/{name:.+}", handler)
    return app


Handler = Callable[[web.Request, Callable[[web.Request], Path], Recorder], object]


async def _ok(request, file_of, rec):  # type: ignore[no-untyped-def]
    path = file_of(request)
    if request.method == "HEAD":
        st = path.stat()
        return web.Response(
            headers={
                "Accept-Ranges": "bytes",
                "Content-Length": str(st.st_size),
                "ETag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"',
            }
        )
    return await _send(request, path)


async def _nohead(request, file_of, rec):  # type: ignore[no-untyped-def]
    if request.method == "HEAD":
        raise web.HTTPMethodNotAllowed("HEAD", ["GET"])
    return await _send(request, file_of(request))


async def _forbidhead(request, file_of, rec):  # type: ignore[no-untyped-def]
    if request.method == "HEAD":
        raise web.HTTPForbidden()
    return await _send(request, file_of(request))


async def _noranges(request, file_of, rec):  # type: ignore[no-untyped-def]
    return await _send(request, file_of(request), ranges=False)


async def _htmltype(request, file_of, rec):  # type: ignore[no-untyped-def]
    return await _send(request, file_of(request), content_type="text/html")


async def _nolength(request, file_of, rec):  # type: ignore[no-untyped-def]
    return await _send(request, file_of(request), length=False, ranges=False)


async def _flaky(request, file_of, rec):  # type: ignore[no-untyped-def]
    if request.method == "GET" and rec.bump("flaky") <= 2:
        raise web.HTTPServiceUnavailable(text="<html>try later</html>", content_type="text/html")
    return await _send(request, file_of(request))


async def _alwaysdown(request, file_of, rec):  # type: ignore[no-untyped-def]
    raise web.HTTPBadGateway(text="<html>bad gateway</html>", content_type="text/html")


async def _cut(request, file_of, rec):  # type: ignore[no-untyped-def]
    path = file_of(request)
    first = request.method == "GET" and rec.bump("cut") == 1
    return await _send(request, path, cut_at=path.stat().st_size // 2 if first else None)


async def _cutnoranges(request, file_of, rec):  # type: ignore[no-untyped-def]
    path = file_of(request)
    first = request.method == "GET" and rec.bump("cutnr") == 1
    return await _send(
        request, path, ranges=False, cut_at=path.stat().st_size // 2 if first else None
    )


async def _alwayscut(request, file_of, rec):  # type: ignore[no-untyped-def]
    path = file_of(request)
    start = _parse_range(request.headers.get(hdrs.RANGE), path.stat().st_size)
    return await _send(request, path, cut_at=start + 4096)


async def _cuteach(request, file_of, rec):  # type: ignore[no-untyped-def]
    """The first request for each segment (each range end) is cut 1 MiB in."""
    if request.method == "HEAD":
        return await _ok(request, file_of, rec)
    path = file_of(request)
    header = request.headers.get(hdrs.RANGE) or "bytes=0-"
    start = _parse_range(header, path.stat().st_size)
    first = request.method == "GET" and rec.bump(f"cuteach:{header.split('-')[-1]}") == 1
    return await _send(request, path, cut_at=start + CHUNK if first else None)


async def _slow(request, file_of, rec):  # type: ignore[no-untyped-def]
    """Ranges work, but bodies trickle until a test sets ``counters["fast"]``."""
    path = file_of(request)
    if request.method == "HEAD":
        return await _ok(request, file_of, rec)
    return await _send(request, path, delay=0 if rec.counters.get("fast") else 0.1)


async def _paced(request, file_of, rec):  # type: ignore[no-untyped-def]
    """100 MB/s a response: waiting for the network clearly dominates, so a client that
    splits when the network is slow does so whatever the machine's load."""
    if request.method == "HEAD":
        return await _ok(request, file_of, rec)
    return await _send(request, file_of(request), delay=0.01)


async def _dropidle(request, file_of, rec):  # type: ignore[no-untyped-def]
    """Paced, answers in full with keep-alive, then drops the connection (as an idle timeout
    would): a client that reuses it finds it dead on its next request."""
    resp = await _paced(request, file_of, rec)
    if request.method == "GET" and request.transport is not None:
        request.transport.close()  # after the streamed body, which has been queued
    return resp


async def _html200(request, file_of, rec):  # type: ignore[no-untyped-def]
    return web.Response(body=HTML_PAGE, content_type="text/html")


async def _auth(request, file_of, rec):  # type: ignore[no-untyped-def]
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header != encode_basic_auth("alice", "s3cret"):
        raise web.HTTPUnauthorized(text="<html>login</html>", content_type="text/html")
    return await _send(request, file_of(request))


async def _header(request, file_of, rec):  # type: ignore[no-untyped-def]
    if request.headers.get("X-Token") != "t0ken" or request.headers.get("X-Plain") != "yes":
        raise web.HTTPForbidden(text="missing headers")
    return await _send(request, file_of(request))


async def _redirect(request, file_of, rec):  # type: ignore[no-untyped-def]
    raise web.HTTPFound(f"/ok/{request.match_info['name']}")


async def _downgrade(request, file_of, rec):  # type: ignore[no-untyped-def]
    """Redirects to the same file over plain http (from an https server: a downgrade)."""
    raise web.HTTPFound(f"http://{request.host}/ok/{request.match_info['name']}")


async def _badlocation(request, file_of, rec):  # type: ignore[no-untyped-def]
    """Redirects to a Location with non-ASCII characters (sent as UTF-8 bytes)."""
    location = f"/ok/{request.match_info['name']}-\u00e9t\u00e9"  # not percent-encoded
    return web.Response(status=302, headers={"Location": location})


BEHAVIOURS = {
    "ok": _ok,
    "nohead": _nohead,
    "forbidhead": _forbidhead,
    "noranges": _noranges,
    "htmltype": _htmltype,
    "nolength": _nolength,
    "flaky": _flaky,
    "alwaysdown": _alwaysdown,
    "cut": _cut,
    "cuteach": _cuteach,
    "cutnoranges": _cutnoranges,
    "alwayscut": _alwayscut,
    "html200": _html200,
    "slow": _slow,
    "auth": _auth,
    "header": _header,
    "redirect": _redirect,
    "paced": _paced,
    "dropidle": _dropidle,
    "downgrade": _downgrade,
    "badlocation": _badlocation,
}

__all__ = ["BEHAVIOURS", "Recorder", "make_app"]
