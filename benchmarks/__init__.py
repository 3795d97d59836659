"""Side-by-side benchmark of `cdi import` against the tools a user would reach for instead.

`python -m benchmarks.run` (or `benchmarks/run.py`) builds the test images once, serves them over
loopback HTTP, runs our importer and the reference pipelines round-robin and prints each
reference/ours time ratio against the targets of issues 2 and 4. See benchmarks/README.md.
"""
