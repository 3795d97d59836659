#!/usr/bin/env bash
# Build the real Kubernetes control plane used by the integration tests (testkit/) from Go
# modules: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, and the real
# node's kubelet and kube-proxy (testkit's node="real"), with the static pause of
# its build/pause/linux/pause.c, of one release from k8s.io/kubernetes
# (module ./k8s), the etcd 3.6 server (module ./etcd) and the CSI
# snapshot-controller of kubernetes-csi/external-snapshotter (module ./snapshot), with the
# VolumeSnapshot CRDs of the same release.
#
# Output: hack/kube/_build/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,
# kubectl,kubelet,kube-proxy,pause,snapshot-controller} and hack/kube/_build/crd/*.yaml (git-ignored). Cached: a stamp records the hash of every input (go.mod, go.sum,
# sources, this script, the Go version); when it matches and the binaries exist, the script
# exits at once. Each build is also kept under ~/.cache/cdi-py/kube/<hash>/ (XDG_CACHE_HOME is
# honoured; the three newest are kept), so a fresh clone or another worktree with the same
# inputs copies it in seconds.
#   hack/kube/build.sh           build if inputs changed
#   hack/kube/build.sh --force   rebuild regardless of the stamp
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/_build"
bin="$out/bin"
stamp="$out/stamp"
crd="$out/crd"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy
  pause snapshot-controller)
# The snapshot.storage.k8s.io/v1 CRDs the snapshot-controller serves (group snapshots stay off).
crds=(volumesnapshotclasses volumesnapshotcontents volumesnapshots)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/cdi-py/kube"

command -v go >/dev/null || { echo "hack/kube: no Go toolchain on PATH (need Go >= 1.25)" >&2; exit 1; }
command -v cc >/dev/null || { echo "hack/kube: no C compiler (pause.c): scripts/setup.sh --test" >&2; exit 1; }

kube_version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/k8s/go.mod" | head -n1)"
# The module may list it in a require block ("k8s.io/kubernetes vX") or a one-line require.
if [[ -z "$kube_version" ]]; then
  kube_version="$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\).*/\1/p' "$here/k8s/go.mod")"
fi
etcd_version="$(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*/\1/p' "$here/etcd/go.mod")"
snapshot_module=github.com/kubernetes-csi/external-snapshotter/v8
snapshot_client=github.com/kubernetes-csi/external-snapshotter/client/v8
snapshot_version="$(awk -v m="$snapshot_module" '$1 == m {print $2}' "$here/snapshot/go.mod" | head -n1)"
[[ -n "$kube_version" && -n "$etcd_version" && -n "$snapshot_version" ]] || {
  echo "build.sh: cannot read versions" >&2
  exit 1
}
versions="kubernetes $kube_version, etcd $etcd_version, external-snapshotter $snapshot_version"

inputs_hash() {
  {
    go version
    cat "$0"
    cat "$here"/k8s/go.mod "$here"/k8s/go.sum "$here"/k8s/*.go
    cat "$here"/etcd/go.mod "$here"/etcd/go.sum "$here"/etcd/*.go
    cat "$here"/snapshot/go.mod "$here"/snapshot/go.sum "$here"/snapshot/*.go
  } | sha256sum | cut -d' ' -f1
}

want="$(inputs_hash)"
if [[ "${1:-}" != "--force" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  all=1
  for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || all=0; done
  for c in "${crds[@]}"; do [[ -f "$crd/$c.yaml" ]] || all=0; done
  if ((all)); then
    echo "hack/kube: up to date ($versions)"
    exit 0
  fi
fi

mkdir -p "$bin" "$crd"
rm -f "$stamp"
cached="$cache_root/$want"
if [[ "${1:-}" != "--force" && -f "$cached/complete" ]]; then
  for b in "${binaries[@]}"; do cp -f "$cached/$b" "$bin/$b"; done
  for c in "${crds[@]}"; do cp -f "$cached/crd/$c.yaml" "$crd/$c.yaml"; done
  echo "$want" > "$stamp"
  echo "hack/kube: copied from $cached ($versions)"
  exit 0
fi
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
start=$SECONDS

echo "hack/kube: building etcd $etcd_version"
(
  cd "$here/etcd"
  go build -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${etcd_version}" \
    -o "$bin/etcd" .
)

echo "hack/kube: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy $kube_version"
minor="${kube_version#v1.}"
minor="${minor%%.*}"
# The same variables hack/lib/version.sh sets upstream, so /version reports the real release.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=${kube_version}"
  ldflags+=" -X $pkg.gitMajor=1"
  ldflags+=" -X $pkg.gitMinor=${minor}"
  ldflags+=" -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(
  cd "$here/k8s"
  go build -trimpath -ldflags "$ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
  # The real node's sandbox image: upstream's pause.c of the same release, linked statically
  # (testkit/realnode.py wraps it in a one-layer image, registry.k8s.io/pause).
  src="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  cc -static -Os -DVERSION="${kube_version}" -o "$bin/pause" "$src"
  strip "$bin/pause"
)

echo "hack/kube: building snapshot-controller $snapshot_version"
(
  cd "$here/snapshot"
  go build -trimpath -ldflags "-s -w -X main.version=${snapshot_version}" -o "$bin/" \
    "$snapshot_module/cmd/snapshot-controller"
  # The CRDs of the same release: the client module pinned by go.sum holds config/crd.
  client_dir="$(go list -m -f '{{.Dir}}' "$snapshot_client")"
  for c in "${crds[@]}"; do
    cp -f "$client_dir/config/crd/snapshot.storage.k8s.io_$c.yaml" "$crd/$c.yaml"
    chmod 0644 "$crd/$c.yaml"
  done
)

# Keep a copy outside the tree for other checkouts; written fully before it is marked complete.
mkdir -p "$cached/crd"
for b in "${binaries[@]}"; do cp -f "$bin/$b" "$cached/$b"; done
for c in "${crds[@]}"; do cp -f "$crd/$c.yaml" "$cached/crd/$c.yaml"; done
touch "$cached/complete"
# Keep the three newest builds there (each ~350 MB): enough for a few branches in flight.
ls -1dt "$cache_root"/*/ | tail -n +4 | xargs -r rm -rf
echo "$want" > "$stamp"
echo "hack/kube: built in $((SECONDS - start)) s into $bin"
