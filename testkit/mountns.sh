#!/bin/sh
# Runs inside a fresh private mount namespace (`unshare --mount --propagation private`) made by
# the testkit node agent for one container: bind-mounts the pod's volumes at their mount paths,
# changes to the working directory, then execs the container command, keeping the PID.
#   mountns.sh [--record FILE] [--bind SRC DST rw|ro]... [--dev SRC DST]... [--workdir DIR]
#              -- CMD [ARG]...
# A directory source is bound on a directory, a file or device on a file. Mount points missing
# on the host are created there (the namespace has no root of its own) and listed in the record
# file, so the node agent can remove them at shutdown.
set -eu
die() { echo "testkit mountns: $*" >&2; exit 128; }
workdir=/
record=/dev/null
mkdirs() {  # mkdir -p that records each directory it creates
  p=$1; missing=""
  while [ ! -e "$p" ]; do missing="$p
$missing"; p=$(dirname "$p"); done
  printf '%s' "$missing" | while IFS= read -r m; do
    [ -n "$m" ] || continue
    if mkdir "$m" 2>/dev/null; then echo "$m" >> "$record"; else [ -d "$m" ] || die "cannot create $m"; fi
  done
}
placeholder() {  # an empty file to bind a file or device on
  mkdirs "$(dirname "$1")"
  if [ ! -e "$1" ]; then : > "$1" && echo "$1" >> "$record"; fi
}
while [ $# -gt 0 ]; do
  case "$1" in
    --record) record=$2; shift 2 ;;
    --bind)
      src=$2; dst=$3; mode=$4; shift 4
      if [ -d "$src" ]; then mkdirs "$dst"; else placeholder "$dst"; fi
      mount --bind "$src" "$dst" || die "cannot bind $src on $dst"
      if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst" || die "cannot make $dst read-only"; fi
      ;;
    --dev)
      src=$2; dst=$3; shift 3
      placeholder "$dst"
      mount --bind "$src" "$dst" || die "cannot bind device $src on $dst"
      ;;
    --workdir) workdir=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option $1" ;;
  esac
done
[ $# -gt 0 ] || die "no command"
mkdirs "$workdir"
cd "$workdir"
exec "$@"
