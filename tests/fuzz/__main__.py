"""Run the fuzzers: ``python -m tests.fuzz [--seconds N] [--workdir D] [TARGET ...]``.

Each target runs in its own child process (``python -m tests.fuzz.child``) under libFuzzer's
limits: ``-rss_limit_mb`` (bounded memory), ``-timeout`` (no input may take longer: no hang),
``-max_total_time``. The corpus starts from ``seeds.py`` and grows in the work folder, so a
longer run continues where the last one stopped; crashing inputs land in ``artifacts/``.
Exit status 1 if any target crashed, hung or ran out of memory.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from tests.fuzz.seeds import write_corpus
from tests.fuzz.targets import MAX_LEN, TARGETS

RSS_LIMIT_MB = 1024
INPUT_TIMEOUT_S = 10


def run_target(target: str, seconds: int, workdir: str) -> tuple[bool, str]:
    """Fuzz one target; return (clean, summary line)."""
    corpus = os.path.join(workdir, target, "corpus")
    artifacts = os.path.join(workdir, target, "artifacts") + os.sep
    os.makedirs(artifacts, exist_ok=True)
    seeds = write_corpus(target, corpus)
    cmd = [
        sys.executable, "-m", "tests.fuzz.child", target, corpus,
        f"-max_total_time={seconds}", f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-timeout={INPUT_TIMEOUT_S}", f"-max_len={MAX_LEN[target]}",
        f"-artifact_prefix={artifacts}", "-print_final_stats=1",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = proc.stdout + proc.stderr
    with open(os.path.join(workdir, target, "last.log"), "w") as fh:
        fh.write(log)
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)
    cov = re.findall(r"cov: (\d+)", log)
    summary = (
        f"{target}: {'clean' if proc.returncode == 0 else 'FAILED'} in "
        f"{time.monotonic() - started:.0f} s, {runs[-1] if runs else '?'} inputs, "
        f"coverage {cov[-1] if cov else '?'} edges, {seeds} seeds, "
        f"corpus {len(os.listdir(corpus))}"
    )
    if proc.returncode != 0:
        lines = log.splitlines()
        first = next(
            (i for i, line in enumerate(lines) if "Uncaught Python exception" in line), None
        )
        shown = lines[first : first + 30] if first is not None else []
        summary += "\n" + "\n".join(shown + lines[-12:])
    return proc.returncode == 0, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--workdir", default="_work/fuzz")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {sorted(TARGETS)}")
    clean = True
    for target in args.targets or list(TARGETS):
        ok, summary = run_target(target, args.seconds, args.workdir)
        print(summary, flush=True)
        clean = clean and ok
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
