"""Coverage-guided fuzzing of the parsers that read untrusted bytes (issue 11).

``targets.py`` holds one entry per parser (qcow2, vmdk, vdi, tar; the registry manifest parser
joins when it exists); ``seeds.py`` builds a small valid corpus for each from the test image
builders; ``__main__.py`` runs atheris (libFuzzer) on a target in a child process with memory,
time-per-input and total-time limits, and reports. ``scripts/fuzz.sh`` is the 30-minute run;
``tests/component/test_fuzz_slice.py`` is CI's one-minute slice.
"""
