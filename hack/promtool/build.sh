#!/usr/bin/env bash
# promtool (Prometheus' rule checker and unit tester) from the Go module proxy, built once and
# cached: tests/component/test_alert_rules.py runs `promtool test rules` on the alerts in
# deploy/optional/monitoring.yaml. Result: hack/promtool/bin/promtool.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=v0.316.0   # github.com/prometheus/prometheus (Prometheus 3.x)
# Without the service-discovery plugins (AWS, Azure, GCE, Kubernetes, ... SDKs) that rule
# checking never uses: 3.5 min of CPU to build instead of 9.
TAGS=remove_all_sd
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cdi-py/promtool/$VERSION-$TAGS"
if [[ ! -x "$CACHE/promtool" ]]; then
  mkdir -p "$CACHE"
  start=$SECONDS
  GOBIN="$CACHE" GOFLAGS=-mod=mod nice -n 10 go install -tags "$TAGS" \
    "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
  echo "hack/promtool: built promtool $VERSION in $((SECONDS - start)) s"
fi
mkdir -p bin
cp -f "$CACHE/promtool" bin/promtool
