"""One streaming pass over a source: the event loop moves bytes, two threads do the work.

The loop reads the source and hands every chunk to the progress tap and to two bounded thread
stages, the checksum (of the bytes exactly as they arrive) and the decode stage, so memory is
constant and no CPU work runs on the loop. Kept apart from the phase machine so that a worker
that owns its own loop over a byte stream (an upload handler) can drive a pass itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from datapath.stage import ThreadStage
from datapath.taps import Progress, hash_stream

T = TypeVar("T")


async def pump(
    chunks: AsyncIterator[bytes],
    consume: Callable[[Iterator[bytes]], T],
    progress: Progress,
    *,
    checksum_algorithm: str | None = None,
    hash_prefix: Callable[[], Iterator[bytes]] | None = None,
) -> tuple[T, str | None]:
    """Feed ``chunks`` to ``consume`` on a thread (and to a hash thread when asked); return
    what ``consume`` returned and ``algorithm:hexdigest``. ``hash_prefix`` yields bytes the
    hash must cover before the stream's (a resumed import's earlier bytes)."""
    decode: ThreadStage[T] = ThreadStage(consume, name="decode")
    hasher: ThreadStage[str] | None = None
    if checksum_algorithm is not None:
        algorithm = checksum_algorithm

        def digest(stream: Iterator[bytes]) -> str:
            prefix = hash_prefix() if hash_prefix is not None else iter(())
            return hash_stream(algorithm, _chain(prefix, stream))

        hasher = ThreadStage(digest, name="hash")
    try:
        async for chunk in chunks:
            progress.add(len(chunk))
            if hasher is not None:
                await hasher.put(chunk)
            await decode.put(chunk)
        result = await decode.finish()
        checksum = await hasher.finish() if hasher is not None else None
    except BaseException:
        await decode.abort()
        if hasher is not None:
            await hasher.abort()
        raise
    return result, checksum


def _chain(first: Iterator[bytes], then: Iterator[bytes]) -> Iterator[bytes]:
    yield from first
    yield from then
