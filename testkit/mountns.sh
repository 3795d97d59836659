#!/bin/sh
# Runs inside a fresh private mount namespace (`unshare --mount --propagation private`) made by
# the testkit node agent for one container: bind-mounts the pod's volumes at their mount paths,
# changes to the working directory, then execs the container command, keeping the PID.
#   mountns.sh [--bind SRC DST rw|ro]... [--dev SRC DST]... [--workdir DIR] -- CMD [ARG]...
# A directory source is bound on a directory, a file or device on a file (created if missing).
set -eu
die() { echo "testkit mountns: $*" >&2; exit 128; }
workdir=/
while [ $# -gt 0 ]; do
  case "$1" in
    --bind)
      src=$2; dst=$3; mode=$4; shift 4
      if [ -d "$src" ]; then
        mkdir -p "$dst"
      else
        mkdir -p "$(dirname "$dst")"
        [ -e "$dst" ] || : > "$dst"
      fi
      mount --bind "$src" "$dst" || die "cannot bind $src on $dst"
      if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst" || die "cannot make $dst read-only"; fi
      ;;
    --dev)
      src=$2; dst=$3; shift 3
      mkdir -p "$(dirname "$dst")"
      [ -e "$dst" ] || : > "$dst"
      mount --bind "$src" "$dst" || die "cannot bind device $src on $dst"
      ;;
    --workdir) workdir=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option $1" ;;
  esac
done
[ $# -gt 0 ] || die "no command"
mkdir -p "$workdir"
cd "$workdir"
exec "$@"
