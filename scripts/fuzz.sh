#!/usr/bin/env bash
# Fuzz every parser that reads untrusted bytes (qcow2, vmdk, vdi, tar, the registry client's
# manifests, auth challenges and references, the upload proxy's HTTP/1.1 heads and chunked
# bodies) with atheris:
#   bash scripts/fuzz.sh [MINUTES [TARGET...]]   default 30 minutes in all, split evenly
#   between the targets (default: all of them; e.g. registry-manifest registry-auth)
# The corpus grows in _work/fuzz/<target>/corpus (a later run continues from it); crashing,
# hanging or memory-hungry inputs are written to _work/fuzz/<target>/artifacts/. Exit 1 on any.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test >/dev/null
minutes=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(qcow2 vmdk vdi tar registry-manifest registry-auth registry-reference http1-request
    http1-chunked)
fi
exec .venv/bin/python -m tests.fuzz --seconds $((minutes * 60 / ${#targets[@]})) "${targets[@]}"
