#!/usr/bin/env bash
# testkit's NetworkPolicy enforcer (main.go: the controller of sigs.k8s.io/kube-network-policies
# with a kubeconfig, run by testkit/netpolenforcer.py inside a real node's network namespace)
# from Go modules pinned by go.mod/go.sum (the Go module proxy). Cached: a stamp records the
# hash of the inputs and the Go version; cold, about 2.5 min of one core. Output:
# hack/netpol/_build/kube-network-policies (git-ignored). Not part of the product.
set -euo pipefail
source "$(dirname "$0")/../lib/go-build-local.sh"
go_build_local hack/netpol kube-network-policies "$0"
