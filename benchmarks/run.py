"""Entry point: `.venv/bin/python benchmarks/run.py [options]` (or `-m benchmarks.run`).

Everything lives in `benchmarks.cli`; this file only makes the repository importable when it is
run as a script, so that `benchmarks.*` modules resolve the same way in both invocations.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
