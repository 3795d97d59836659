#!/usr/bin/env bash
# testkit's CSI node plugin (main.go: driver loop.testkit.local on a real node, for the
# testkit-csi-* classes) from Go modules pinned by go.mod/go.sum, the ones the Kubernetes
# build already fetched (CSI spec, gRPC, the kubelet's plugin registration API). Cached: a
# stamp records the hash of the inputs and the Go version. Output:
# hack/csinode/_build/testkit-csi-node (git-ignored). Not part of the product.
set -euo pipefail
source "$(dirname "$0")/../lib/go-build-local.sh"
go_build_local hack/csinode testkit-csi-node "$0"
