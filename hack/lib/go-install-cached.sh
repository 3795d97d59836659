# Sourced by hack/<tool>/build.sh: build one Go command from the Go module proxy at a pinned
# version into hack/<tool>/_build/bin (git-ignored), cached twice. A stamp records the hash of
# the inputs (the calling script, this file, the version, the Go version); the binary is also kept
# under ~/.cache/cdi-py/<name>/<hash>/ (XDG_CACHE_HOME honoured), so another worktree copies it
# in a second. The three newest cached builds are kept.
#   go_install_cached <tag> <name> <package> <version> <script> [--force]
go_install_cached() {
  local tag="$1" name="$2" package="$3" version="$4" script="$5" force="${6:-}"
  local here out bin stamp cache_root want cached start
  here="$(cd "$(dirname "$script")" && pwd)"
  out="$here/_build"
  bin="$out/bin"
  stamp="$out/stamp"
  cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/cdi-py/$name"
  command -v go >/dev/null || { echo "$tag: no Go toolchain on PATH" >&2; return 1; }
  want="$({ go version; cat "$script" "${BASH_SOURCE[0]}"; echo "$version"; } | sha256sum | cut -d' ' -f1)"
  if [[ "$force" != "--force" && -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$bin/$name" ]]; then
    echo "$tag: up to date ($name $version)"
    return 0
  fi
  mkdir -p "$bin"
  rm -f "$stamp"
  cached="$cache_root/$want"
  if [[ "$force" != "--force" && -x "$cached/$name" ]]; then
    cp -f "$cached/$name" "$bin/$name"
    echo "$want" > "$stamp"
    echo "$tag: copied from $cached ($name $version)"
    return 0
  fi
  start=$SECONDS
  echo "$tag: building $name $version"
  CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOBIN="$bin" \
    nice -n 10 go install "$package@$version"
  mkdir -p "$cached"
  cp -f "$bin/$name" "$cached/$name.tmp" && mv -f "$cached/$name.tmp" "$cached/$name"
  ls -1dt "$cache_root"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
  echo "$want" > "$stamp"
  echo "$tag: built $name $version in $((SECONDS - start)) s"
}
