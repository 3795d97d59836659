#!/usr/bin/env bash
# Build versitygw, a real S3 gateway over a directory (github.com/versity/versitygw, Apache-2.0),
# for the S3 import tests: the importer's SigV4 requests, ranges and error documents meet a real
# S3 implementation on loopback (testkit/s3server.py starts it). Built from the Go module proxy
# at a pinned version; no container, no registry.
#
# Output: hack/s3/_build/bin/versitygw (git-ignored). Cached like hack/kube/build.sh: a stamp
# records the hash of the inputs (this script, the version, the Go version); the binary is also
# kept under ~/.cache/cdi-py/versitygw/<hash>/ (XDG_CACHE_HOME honoured), so another worktree
# copies it in a second. A cold build takes a few minutes on two cores.
#   hack/s3/build.sh           build if inputs changed
#   hack/s3/build.sh --force   rebuild regardless of the stamp
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version=v1.8.0
out="$here/_build"
bin="$out/bin"
stamp="$out/stamp"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/cdi-py/versitygw"

command -v go >/dev/null || { echo "hack/s3: no Go toolchain on PATH (need Go >= 1.24)" >&2; exit 1; }
want="$({ go version; cat "$0"; echo "$version"; } | sha256sum | cut -d' ' -f1)"
if [[ "${1:-}" != "--force" && -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$bin/versitygw" ]]; then
  echo "hack/s3: up to date (versitygw $version)"
  exit 0
fi
mkdir -p "$bin"
rm -f "$stamp"
cached="$cache_root/$want"
if [[ "${1:-}" != "--force" && -x "$cached/versitygw" ]]; then
  cp -f "$cached/versitygw" "$bin/versitygw"
  echo "$want" > "$stamp"
  echo "hack/s3: copied from $cached (versitygw $version)"
  exit 0
fi
start=$SECONDS
echo "hack/s3: building versitygw $version"
CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOBIN="$bin" \
  nice -n 10 go install "github.com/versity/versitygw/cmd/versitygw@$version"
mkdir -p "$cached"
cp -f "$bin/versitygw" "$cached/versitygw.tmp" && mv -f "$cached/versitygw.tmp" "$cached/versitygw"
# keep the three newest cached builds
ls -1dt "$cache_root"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "$want" > "$stamp"
echo "hack/s3: built versitygw $version in $((SECONDS - start)) s"
