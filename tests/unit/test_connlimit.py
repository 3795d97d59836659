"""``wire.connlimit``: slots capped in total and per address; a deadline shuts its socket
(the thread blocked on it reads the end of the stream) unless cancelled first. Real socket
pairs."""

from __future__ import annotations

import socket
import time

from wire.connlimit import AddressSlots, Deadlines


def test_slots_are_capped_per_address_and_in_total() -> None:
    slots = AddressSlots(total=3, per_address=2)
    assert [slots.take("a"), slots.take("a"), slots.take("a")] == [True, True, False]
    assert slots.take("b") and not slots.take("c")  # the total is reached
    slots.give("a")
    assert slots.take("c") and slots.in_use == 3
    assert (slots.held_by("a"), slots.held_by("b"), slots.held_by("c")) == (1, 1, 1)


def test_no_per_address_cap_when_zero() -> None:
    slots = AddressSlots(total=3)
    assert all(slots.take("a") for _ in range(3)) and not slots.take("a")


def test_a_deadline_shuts_the_socket_a_blocked_receive_waits_on() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)
        deadline = Deadlines().arm(ours, 0.3)
        started = time.monotonic()
        assert ours.recv(1) == b""  # woken by the shutdown, long before the 5 s timeout
        assert 0.25 < time.monotonic() - started < 2 and deadline.fired


def test_a_cancelled_deadline_leaves_the_socket_alone() -> None:
    deadlines = Deadlines()
    ours, theirs = socket.socketpair()
    other, _peer = socket.socketpair()
    with ours, theirs, other, _peer:
        first = deadlines.arm(ours, 0.2)
        later = deadlines.arm(other, 0.4)  # keeps the watchdog looking past the first
        first.cancel()
        time.sleep(0.6)
        theirs.sendall(b"x")
        ours.settimeout(1)
        assert ours.recv(1) == b"x"  # still open
        assert later.fired and not first.fired and deadlines.pending == 0


def test_cancelled_deadlines_do_not_pile_up_on_a_busy_server() -> None:
    deadlines = Deadlines()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        for _ in range(10 * 1024):  # a head read on each request of a kept-alive connection
            deadlines.arm(ours, 30).cancel()
        assert deadlines.kept <= 2 * 1024
