# Sourced by hack/<tool>/build.sh for a testkit helper whose main package is in hack/<tool>/
# (go.mod/go.sum pin its modules): build it into hack/<tool>/_build/<binary> (git-ignored).
# Cached: a stamp records the hash of the inputs (the calling script, this file, go.mod,
# go.sum, the Go sources) and the Go version.
#   go_build_local <tag> <binary> <script>
go_build_local() {
  local tag="$1" binary="$2" script="$3"
  local here out want start
  here="$(cd "$(dirname "$script")" && pwd)"
  out="$here/_build"
  want="$({ go version; cat "$script" "${BASH_SOURCE[0]}" "$here/go.mod" "$here/go.sum" \
    "$here"/*.go; } | sha256sum | cut -d' ' -f1)"
  if [[ -x "$out/$binary" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want" ]]; then
    echo "$tag: up to date"
    return 0
  fi
  mkdir -p "$out"
  rm -f "$out/stamp"
  start=$SECONDS
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
    go build -trimpath -ldflags "-s -w" -o "$out/$binary" .)
  echo "$want" > "$out/stamp"
  echo "$tag: built in $((SECONDS - start)) s"
}
