"""The authorization answers the controller remembers (DataSource reads, clone authorization)."""

from __future__ import annotations

from cdi.controller import source_reads
from cdi.controller.source_reads import REMEMBER, Remembered


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Asker:
    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        return self.asked % 2 == 1  # yes, then no, then yes...


async def test_an_answer_is_reused_until_it_expires_then_asked_again() -> None:
    clock, ask = Clock(), Asker()
    answers: Remembered[str, bool] = Remembered(clock)
    assert await answers.get("k", ask) is True
    clock.now += REMEMBER - 0.1
    assert await answers.get("k", ask) is True
    assert ask.asked == 1
    clock.now += 0.2  # a revoked right takes effect after REMEMBER seconds
    assert await answers.get("k", ask) is False
    assert ask.asked == 2


async def test_answers_are_per_key() -> None:
    ask = Asker()
    answers: Remembered[str, bool] = Remembered(Clock())
    assert await answers.get("a", ask) is True
    assert await answers.get("b", ask) is False
    assert ask.asked == 2


async def test_a_full_memory_forgets_everything_rather_than_growing(monkeypatch) -> None:
    monkeypatch.setattr(source_reads, "_MAX_REMEMBERED", 3)
    ask = Asker()
    answers: Remembered[int, bool] = Remembered(Clock())
    for key in range(4):
        await answers.get(key, ask)
    assert len(answers._answers) == 1  # cleared at the fourth, which alone is kept
    await answers.get(0, ask)
    assert ask.asked == 5
