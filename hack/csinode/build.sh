#!/usr/bin/env bash
# testkit's CSI node plugin (main.go: driver loop.testkit.local on a real node, for the
# testkit-csi-* classes) from Go modules pinned by go.mod/go.sum, the ones the Kubernetes
# build already fetched (CSI spec, gRPC, the kubelet's plugin registration API). Cached: a
# stamp records the hash of the inputs and the Go version. Output:
# hack/csinode/_build/testkit-csi-node (git-ignored). Not part of the product.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/_build"
want="$({ go version; cat "$0" "$here/go.mod" "$here/go.sum" "$here"/*.go; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$out/testkit-csi-node" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want" ]]; then
  echo "hack/csinode: up to date"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/stamp"
start=$SECONDS
(cd "$here" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
  go build -trimpath -ldflags "-s -w" -o "$out/testkit-csi-node" .)
echo "$want" > "$out/stamp"
echo "hack/csinode: built in $((SECONDS - start)) s"
