"""CI's one-minute slice of the fuzzing run (``scripts/fuzz.sh`` is the 30-minute one): each
parser that reads untrusted bytes is fuzzed by atheris from the seed corpus and must end with
no crash, no hang and no memory blow-up (typed errors only). The image decoders get 8 s each,
the registry client's small JSON and header parsers and the upload proxy's HTTP/1.1 parser
3 s each (they run far more inputs per second), so the slice stays at about a minute."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.__main__ import run_target
from tests.fuzz.targets import TARGETS


def slice_seconds(target: str) -> int:
    return 3 if target.startswith(("registry-", "http1-")) else 8


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_parser_survives_a_fuzzing_slice(target: str, tmp_path: Path) -> None:
    clean, summary = run_target(target, slice_seconds(target), str(tmp_path))
    print(summary)
    assert clean, summary
    assert " inputs" in summary and "? inputs" not in summary  # it really ran
