#!/usr/bin/env bash
# testkit's NetworkPolicy enforcer (main.go: the controller of sigs.k8s.io/kube-network-policies
# with a kubeconfig, run by testkit/netpolenforcer.py inside a real node's network namespace)
# from Go modules pinned by go.mod/go.sum (the Go module proxy). Cached: a stamp records the
# hash of the inputs and the Go version; cold, about 2.5 min of one core. Output:
# hack/netpol/_build/kube-network-policies (git-ignored). Not part of the product.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/_build"
bin="$out/kube-network-policies"
want="$({ go version; cat "$0" "$here/go.mod" "$here/go.sum" "$here"/*.go; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$bin" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want" ]]; then
  echo "hack/netpol: up to date"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/stamp"
start=$SECONDS
(cd "$here" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
  go build -trimpath -ldflags "-s -w" -o "$bin" .)
echo "$want" > "$out/stamp"
echo "hack/netpol: built in $((SECONDS - start)) s"
