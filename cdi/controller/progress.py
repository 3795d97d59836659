"""Import progress from the importer's Prometheus endpoint: parsing (pure) and scraping.

CDI scrapes ``kubevirt_cdi_import_progress_total{ownerUID="<uid>"}`` from the running pod and
shows it as ``"%.2f%%"``; our importer also exports bytes done, bytes total and the mean rate,
which the controller shows in the Running condition's message. Parsing is a pure function of
the exposition text; ``HttpScraper`` is the only I/O, injected into the reconciler so unit
tests pass a function instead of a server.

The scraped pod runs tenant-influenced code paths, so its answer is untrusted input: the
scraper reads at most ``MAX_METRICS_BYTES`` (64 KiB; our importer's page is under 2 KiB),
gives up after ``timeout`` seconds in total, follows no redirect, and turns every bad answer
(too big, too slow, not 200, not UTF-8, unreachable) into None: no progress shown, nothing
fatal.

The page also carries ``cdi_import_checkpoint_bytes{digest}``, the importer's last durable
resume checkpoint. It is read from the recorded pod only, so the import flavour keeps it (in
memory, outside the tenant's volume) as the attestation for the next attempt's resume.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import aiohttp

PROGRESS_METRIC = "kubevirt_cdi_import_progress_total"
CHECKPOINT_METRIC = "cdi_import_checkpoint_bytes"  # {digest}: the last durable resume point
MAX_METRICS_BYTES = 64 * 1024
_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Progress:
    percent: float
    bytes_done: int = 0
    bytes_total: int = 0
    rate: float = 0.0
    checkpoint: tuple[int, str] | None = None  # (offset, BLAKE3 of the prefix)

    @property
    def text(self) -> str:
        """CDI's status.progress format."""
        return f"{min(100.0, max(0.0, self.percent)):.2f}%"

    def describe(self, activity: str = "Import") -> str:
        if not (self.bytes_done or self.bytes_total):  # only the percentage is known
            return f"{activity} in progress: {self.text}"
        done = human_bytes(self.bytes_done)
        total = f" of {human_bytes(self.bytes_total)}" if self.bytes_total else ""
        return f"{activity} in progress: {done}{total} at {human_bytes(int(self.rate))}/s"


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"


def parse_metrics(text: str, owner_uid: str, kind: str = "import") -> Progress | None:
    """The progress series for ``owner_uid``, or None when the percentage is absent. ``kind``
    names the worker's series: ``import`` (the importer), ``clone`` (the clone source pod,
    ``kubevirt_cdi_clone_progress_total`` as CDI's cloner)."""
    progress_metric = f"kubevirt_cdi_{kind}_progress_total"
    checkpoint_metric = f"cdi_{kind}_checkpoint_bytes"
    values: dict[str, float] = {}
    digest = ""
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("ownerUID") != owner_uid:
            continue
        try:
            values[m.group("name")] = float(m.group("value"))
        except ValueError:
            continue
        if m.group("name") == checkpoint_metric:
            digest = labels.get("digest", "")
    if progress_metric not in values:
        return None
    return Progress(
        percent=values[progress_metric],
        bytes_done=int(values.get(f"cdi_{kind}_bytes_done", 0)),
        bytes_total=int(values.get(f"cdi_{kind}_bytes_total", 0)),
        rate=values.get(f"cdi_{kind}_rate_bytes_per_second", 0.0),
        checkpoint=_checkpoint(values.get(checkpoint_metric), digest),
    )


def _checkpoint(offset: float | None, digest: str) -> tuple[int, str] | None:
    """The scraped resume point, if well formed (a 64-hex BLAKE3 digest and a positive offset)."""
    if offset is None or offset <= 0 or not _SHA256.fullmatch(digest):
        return None
    return int(offset), digest


class Scraper(Protocol):
    async def __call__(self, pod_ip: str, port: int) -> str | None: ...


class HttpScraper:
    """GET ``http://<podIP>:<port>/metrics``: bounded in time and size; None on any bad answer."""

    def __init__(self, timeout: float = 2.0, max_bytes: int = MAX_METRICS_BYTES) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, pod_ip: str, port: int) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        try:
            url = f"http://{host}:{port}/metrics"
            async with self._session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    return None
                return await self._bounded_text(resp)
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
            return None

    async def _bounded_text(self, resp: aiohttp.ClientResponse) -> str | None:
        if (resp.content_length or 0) > self.max_bytes:
            return None
        body = bytearray()
        async for chunk in resp.content.iter_chunked(16 * 1024):
            body += chunk
            if len(body) > self.max_bytes:
                return None
        return body.decode("utf-8")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
