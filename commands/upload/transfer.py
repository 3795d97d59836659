"""The bytes of ``cdi upload``: ``commands.upload.client`` (async detection, streamed POST, tus
resume after a cut, token refresh) under virtctl's rules for authentication.

virtctl gives up at once when the very first request is refused with 401 (the token never
worked: wrong proxy, wrong keys), and refreshes the token on a later 401 (it expired during a
long upload), at most three times. The first request is the async-detection ``HEAD``, so it
is made here first and a 401 ends the command with ``authentication failed: <server's
words>``; afterwards the client asks our provider for fresh tokens, which come from a new
``UploadTokenRequest`` made off the event loop. Connection failures the client does not retry
(the proxy is not there, its certificate is not trusted) leave here as typed errors.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from commands.upload.client import ClientSettings, UploadResult, upload_file
from commands.upload.options import UploadCliError, proxy_base

TOKEN_REFRESHES: Final = 3  # virtctl's bound
PROBE_PATH: Final = "/v1beta1/upload-async"


class AuthenticationFailed(UploadCliError):
    reason = "AuthenticationFailed"


class ProxyUnreachable(UploadCliError):
    reason = "UploadProxyUnreachable"
    transient = True


@dataclass(frozen=True)
class ClientTransfer:
    insecure: bool = False
    attempts: int = 5
    ca_pem: str | None = None  # a CA to trust besides the system's (the proxy's own CA)

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.insecure:
            return False
        if not self.ca_pem:
            return True
        context = ssl.create_default_context()
        context.load_verify_locations(cadata=self.ca_pem)
        return context

    async def __call__(
        self,
        url: str,
        path: Path,
        token: Callable[[], str],
        refresh: Callable[[], str],
        progress: Callable[[int, int], None],
    ) -> tuple[str, ...]:
        base = proxy_base(url)
        settings = ClientSettings(
            base_url=base,
            ssl=self.ssl_context(),
            attempts=self.attempts,
            token_refreshes=TOKEN_REFRESHES,
        )
        first = token()
        size = (await asyncio.to_thread(path.stat)).st_size
        calls = 0

        async def tokens() -> str:
            nonlocal calls
            calls += 1
            return first if calls == 1 else await asyncio.to_thread(refresh)

        try:
            await self.first_attempt(settings, first)
            result = await upload_file(
                str(path), settings, tokens, lambda done, _: progress(done, size)
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise unreachable(base, exc) from exc
        return notes(result)

    async def first_attempt(self, settings: ClientSettings, token: str) -> None:
        """virtctl's first request (async detection); a 401 here is final."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.head(
                settings.base_url + PROBE_PATH,
                headers={"Authorization": f"Bearer {token}"},
                ssl=settings.ssl,
            ) as resp,
        ):
            if resp.status == 401:
                said = (await resp.text(errors="replace")).strip() or resp.reason or "401"
                raise AuthenticationFailed(f"authentication failed: {said}")


def unreachable(base: str, exc: BaseException) -> ProxyUnreachable:
    hint = ""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        hint = " (trust the proxy's CA, or pass --insecure)"
    return ProxyUnreachable(
        f"cannot reach the upload proxy {base}: {exc or type(exc).__name__}{hint}"
    )


def notes(result: UploadResult) -> tuple[str, ...]:
    """What the user should know about how the bytes got there."""
    said = []
    if result.resumed:
        said.append(
            f"The connection was cut; resumed {result.resumed} time(s) "
            "from the last byte the server had"
        )
    said += [f"The upload started over: {why}" for why in result.restarted]
    return tuple(said)
