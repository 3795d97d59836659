"""The libFuzzer process for one target: ``python -m tests.fuzz.child TARGET [libFuzzer args]``.

The data path's and the registry client's modules (``targets.INSTRUMENTED``) are imported under
atheris' instrumentation so coverage guides the mutations into the parsers' branches;
everything else (cdi.api, tests) is not instrumented.
"""

from __future__ import annotations

import sys

import atheris


def main() -> None:
    target = sys.argv[1]
    from tests.fuzz.targets import INSTRUMENTED

    with atheris.instrument_imports(include=list(INSTRUMENTED)):
        from tests.fuzz.targets import TARGETS

        fuzz = TARGETS[target]
        fuzz(b"")  # import the parser's modules now, under instrumentation
    atheris.Setup([sys.argv[0], *sys.argv[2:]], fuzz)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
