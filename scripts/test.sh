#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, types, import-layer contracts, then
# pytest (unit, component and integration tiers). This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [[ -x hack/kube/build.sh ]]; then
  bash hack/kube/build.sh            # real kube-apiserver/etcd from Go modules (cached)
fi
bash hack/promtool/build.sh          # promtool for the alert rules' tests (cached)
bash hack/s3/build.sh                # versitygw, the S3 tests' real gateway (cached)
# The product images (build/images/oci) the real-node tests pull (tests/integration/
# test_real_node.py): about 100 s cold, 37 s with the base layer cached.
bash scripts/images.sh
bash hack/gcs/build.sh               # fake-gcs-server, the GCS tests' real emulator (cached)
echo "== ruff";        .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy";        .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports
echo "== pytest"
.venv/bin/pytest -q -p no:cacheprovider "$@"
