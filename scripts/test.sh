#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, types, import-layer contracts, then
# pytest (unit, component, end-to-end and integration tiers). This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests' own tools built from Go modules (each cached; a warm run copies them in a
# second): started first, in the background, so a cold build overlaps the installs, the
# Kubernetes build's downloads, the images and lint. Their output is shown when they are
# waited for, before pytest; a failed build fails the run there.
tool_logs="$(mktemp -d)"
tool_pids=()
for tool in promtool s3 gcs netpol; do   # promtool: the alert rules; versitygw: S3; fake-gcs-server: GCS;
  # netpol: kube-network-policies, the NetworkPolicy enforcer of tests/e2e/test_network_policies.py
  bash "hack/$tool/build.sh" > "$tool_logs/$tool.log" 2>&1 &
  tool_pids+=("$!")
done
bash scripts/setup.sh --test
if [[ -x hack/kube/build.sh ]]; then
  bash hack/kube/build.sh            # real kube-apiserver/etcd from Go modules (cached)
fi
bash hack/csinode/build.sh           # the real node's CSI node plugin (modules as above; cached)
# The product images (build/images/oci) the real-node tests pull (tests/integration/
# test_real_node.py and the end-to-end tier, tests/e2e): about 100 s cold, 37 s with the base
# layer cached.
bash scripts/images.sh
echo "== ruff";        .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy";        .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports
echo "== test tools"
failed=0
for i in "${!tool_pids[@]}"; do
  wait "${tool_pids[$i]}" || failed=1
done
cat "$tool_logs"/*.log
rm -rf "$tool_logs"
(( failed == 0 )) || { echo "a test tool did not build (above)" >&2; exit 1; }
echo "== pytest"
.venv/bin/pytest -q -p no:cacheprovider "$@"
