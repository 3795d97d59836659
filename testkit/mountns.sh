#!/bin/sh
# Runs inside a fresh private mount namespace (`unshare --mount --propagation private`) made by
# the testkit node agent for one container: bind-mounts the pod's volumes at their mount paths,
# changes to the working directory, then execs the container command, keeping the PID.
#   mountns.sh [--record FILE] [--hostname NAME] [--keep PATH]... [--bind SRC DST rw|ro]...
#              [--dev SRC DST]... [--workdir DIR] [--read-only-root] -- CMD [ARG]...
# --hostname sets the name in the UTS namespace the node agent made (`unshare --uts`).
# --read-only-root (a container with securityContext.readOnlyRootFilesystem) remounts the
# namespace's root read-only once everything is bound, as a kubelet's runtime does: the command
# can then write only to its volumes (and /dev, /proc, /sys), never to the host's files.
# --keep names a host path the container's command lives in (the repository, the Python
# install): if a volume is mounted over one of its parents (an emptyDir at /tmp while the
# checkout is under /tmp), the path is bound back on top, so the program is still there.
# A directory source is bound on a directory, a file or device on a file. Mount points missing
# on the host are created there (the namespace has no root of its own) and listed in the record
# file, so the node agent can remove them at shutdown.
set -eu
die() { echo "testkit mountns: $*" >&2; exit 128; }
workdir=/
record=/dev/null
ro_root=""
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
bind() {
  if [ -d "$1" ]; then mkdirs "$2"; else placeholder "$2"; fi
  mount --bind "$1" "$2" || die "cannot bind $1 on $2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$2" || die "cannot make $2 read-only"; fi
}
# A volume mounted over a directory that holds other volumes' sources (an emptyDir at /tmp
# while the node's state lives under /tmp) must wait until those sources are bound.
srcs=""; prev=""
for a in "$@"; do
  [ "$a" = "--" ] && break
  case "$prev" in --bind|--dev) srcs="$srcs
$a" ;; esac
  prev=$a
done
shadows() { printf '%s\n' "$srcs" | { while IFS= read -r s; do case "$s" in "$1"/*) exit 0 ;; esac; done; exit 1; }; }
deferred=""
keeps=""
dsts=""
stage=/run/testkit-keep/$$
tab=$(printf '\t')
while [ $# -gt 0 ]; do
  case "$1" in
    --record) record=$2; shift 2 ;;
    --hostname) printf '%s' "$2" > /proc/sys/kernel/hostname || die "cannot set hostname $2"; shift 2 ;;
    --keep)
      n=$(printf '%s\n' "$keeps" | grep -c . || true)
      mkdirs "$stage/$n"
      mount --bind "$2" "$stage/$n" || die "cannot stage $2"
      keeps="$keeps
$2"; shift 2 ;;
    --bind)
      src=$2; dst=$3; mode=$4; shift 4
      dsts="$dsts
$dst"
      if shadows "$dst"; then deferred="$deferred
$src$tab$dst$tab$mode"; else bind "$src" "$dst" "$mode"; fi
      ;;
    --dev)
      src=$2; dst=$3; shift 3
      placeholder "$dst"
      mount --bind "$src" "$dst" || die "cannot bind device $src on $dst"
      ;;
    --workdir) workdir=$2; shift 2 ;;
    --read-only-root) ro_root=1; shift ;;
    --) shift; break ;;
    *) die "unknown option $1" ;;
  esac
done
printf '%s\n' "$deferred" | while IFS="$tab" read -r s d m; do
  [ -z "$s" ] || bind "$s" "$d" "$m"
done
# Bring back kept paths that a volume now hides.
n=0
printf '%s\n' "$keeps" | while IFS= read -r k; do
  [ -n "$k" ] || continue
  hidden=$(printf '%s\n' "$dsts" | while IFS= read -r d; do
    case "$k" in "$d"/*) echo yes; break ;; esac; done)
  if [ -n "$hidden" ]; then
    mkdirs "$k"
    mount --bind "$stage/$n" "$k" || die "cannot keep $k visible"
  fi
  n=$((n + 1))
done
[ $# -gt 0 ] || die "no command"
mkdirs "$workdir"
if [ -n "$ro_root" ]; then
  # Only the root mount's flag, in this namespace: the binds above are mounts of their own.
  mount -o remount,bind,ro / || die "cannot make the root read-only"
fi
cd "$workdir"
exec "$@"
