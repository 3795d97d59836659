#!/usr/bin/env bash
# Install what this project needs on a fresh Debian machine (run as root), then the Python
# environment at .venv. Idempotent: a second run only checks.
#   scripts/setup.sh          runtime only (what `cdi import` needs)
#   scripts/setup.sh --test   runtime + test, lint and benchmark tools, and the real node's
#                             runtime (containerd, runc, CNI) and image tools
#   scripts/setup.sh --images runtime + what scripts/images.sh needs (mmdebstrap, umoci, skopeo, cc)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

apt_pkgs=(qemu-utils libmagic1 xz-utils zstd bzip2 gzip curl ca-certificates e2fsprogs util-linux)
if [[ "$mode" == "--test" ]]; then
  apt_pkgs+=(pigz iproute2 hyperfine time mount tar)
  # socat: the benchmark's C relay in place of the upload proxy (the floor of any proxy here)
  apt_pkgs+=(socat)
  # rclone: the S3 benchmark's reference (benchmarks/s3.py), what a user copies objects with
  apt_pkgs+=(rclone)
  # docker-registry, skopeo, umoci, apache2-utils (htpasswd): registry import tests and benchmark;
  # xorriso: an ISO containerDisk
  apt_pkgs+=(docker-registry skopeo umoci apache2-utils xorriso)
  # The test node's VM (testkit/vm.py): qemu (TCG), Debian's kernel, busybox for the initramfs.
  apt_pkgs+=(qemu-system-x86 linux-image-amd64 busybox-static cpio)
  # The real node (testkit/realnode.py, test_real_node.py, tests/e2e): containerd + runc,
  # the CNI bridge/host-local/loopback plugins, iptables for kubelet and kube-proxy; cc for the
  # pause image (hack/kube/build.sh); and what scripts/images.sh needs for the product images.
  apt_pkgs+=(containerd runc containernetworking-plugins iptables gcc libc6-dev mmdebstrap)
fi
if [[ "$mode" == "--images" ]]; then
  apt_pkgs+=(mmdebstrap umoci skopeo gcc libc6-dev)
fi
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
extra=""
[[ "$mode" == "--test" ]] && extra="[test]"
stamp=".venv/.installed${extra:+-test}"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e ".${extra}"
  touch "$stamp"
fi
