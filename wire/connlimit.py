"""Bounds for the servers anything in the cluster can reach: slots per client address and
total deadlines, shared by the upload proxy, the upload server's TLS front and a worker's
metrics page.

Why these two pieces (security review 3, N3, N4, M1):

- A cap on connections alone lets one client take every slot (and the memory behind them):
  ``AddressSlots`` also caps what one address may hold, so a single pod (or one host)
  cannot starve clients that come from elsewhere. Many addresses at once are for a
  NetworkPolicy to keep out (docs/security.md).
- A socket timeout is per receive: one byte a minute keeps a TLS handshake or a request
  head going for ever. ``Deadlines`` gives a phase a total: when it passes, one watchdog
  thread shuts the socket both ways, and the thread blocked on it reads the end of the
  stream. One thread for every connection, not a timer thread each.

Stdlib only, so the workers (``datapath``, ``uploader``) and the control plane share it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections import Counter

COMPACT_FROM = 1024  # armed deadlines kept before cancelled ones are swept out


class AddressSlots:
    """At most ``total`` slots, at most ``per_address`` of them for one client address
    (0: no per-address cap). Thread-safe."""

    def __init__(self, total: int, per_address: int = 0) -> None:
        self.total, self.per_address = total, per_address
        self._held: Counter[str] = Counter()
        self._count = 0
        self._lock = threading.Lock()

    def take(self, address: str) -> bool:
        """A slot for ``address``; False if none is free for it."""
        with self._lock:
            if self._count >= self.total:
                return False
            if self.per_address and self._held[address] >= self.per_address:
                return False
            self._held[address] += 1
            self._count += 1
            return True

    def give(self, address: str) -> None:
        with self._lock:
            self._held[address] -= 1
            self._count -= 1
            if self._held[address] <= 0:
                del self._held[address]

    @property
    def in_use(self) -> int:
        return self._count

    def held_by(self, address: str) -> int:
        with self._lock:
            return self._held.get(address, 0)


class Deadline:
    """One armed deadline; ``cancel`` it once the phase it bounds is over."""

    def __init__(self, sock: socket.socket, when: float) -> None:
        self.sock, self.when = sock, when
        self.cancelled = self.fired = False

    def cancel(self) -> None:
        self.cancelled = True


class Deadlines:
    """Shuts a socket when its deadline passes (unless cancelled first), from one daemon
    thread started on first use."""

    def __init__(self, name: str = "deadlines") -> None:
        self.name = name
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._compact_at = COMPACT_FROM

    def arm(self, sock: socket.socket, seconds: float) -> Deadline:
        """Shut ``sock`` (both ways) ``seconds`` from now."""
        deadline = Deadline(sock, time.monotonic() + seconds)
        with self._wake:
            if len(self._heap) >= self._compact_at:
                self._compact()
            heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=self.name, daemon=True)
                self._thread.start()
            self._wake.notify()
        return deadline

    def _compact(self) -> None:
        """Drop cancelled deadlines (and their sockets) before they come due: a busy server
        cancels nearly every one it arms. Amortised: the heap has doubled since the last."""
        self._heap = [entry for entry in self._heap if not entry[2].cancelled]
        heapq.heapify(self._heap)
        self._compact_at = max(COMPACT_FROM, 2 * len(self._heap))

    def _watch(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(wait)
                _, _, deadline = heapq.heappop(self._heap)
                if deadline.cancelled:
                    continue
                deadline.fired = True
            with contextlib.suppress(OSError):  # closed already: nothing left to wake
                deadline.sock.shutdown(socket.SHUT_RDWR)

    @property
    def pending(self) -> int:
        """Armed deadlines not yet cancelled or fired."""
        with self._wake:
            return sum(not d.cancelled and not d.fired for _, _, d in self._heap)

    @property
    def kept(self) -> int:
        """Entries kept, cancelled ones not yet swept out included (memory held)."""
        with self._wake:
            return len(self._heap)
