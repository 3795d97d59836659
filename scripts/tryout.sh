#!/usr/bin/env bash
# The one-command local try-out (needs root, as the test cluster does): install what is needed
# (Debian packages, .venv, the Kubernetes control plane and kubectl built from Go modules,
# cached), start the test cluster, apply crds/ and deploy/ with kubectl, serve an example disk
# image on loopback and print the kubeconfig path and a copy-paste DataVolume. Stays up until
# Ctrl-C, then removes everything it made (processes, mounts, loop devices, state directory).
#   bash scripts/tryout.sh [--image-port N] [--state-dir DIR] [--real-node]
# --real-node: a real kubelet + containerd in the cluster's own network namespace, running the
# images scripts/images.sh builds (docs/kube-harness.md, "A real node").
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(id -u)" != 0 ]]; then
  echo "scripts/tryout.sh: needs root (loop devices, mounts, mount namespaces); try sudo" >&2
  exit 1
fi
if [[ " $* " == *" --real-node "* ]]; then
  bash scripts/setup.sh --test       # containerd, runc, CNI and the image tools
  bash hack/kube/build.sh
  bash hack/csinode/build.sh         # the CSI node plugin of the provisioner's CSI classes
  bash scripts/images.sh             # the product images the real node pulls
else
  bash scripts/setup.sh
  bash hack/kube/build.sh
fi
exec .venv/bin/python -m testkit.tryout "$@"
