#!/usr/bin/env bash
# Build every product image from Debian packages and the project's wheel, with no registry base
# image (issue 24), into one OCI layout; optionally push them.
#
#   scripts/images.sh [--out DIR] [--tag TAG] [--push REGISTRY [--insecure]] [--rebuild-base]
#   scripts/images.sh --base-only   only the base (and the wheel and cdi-holder): for podman
#
# Layers, bottom up, shared by every image:
#   base    mmdebstrap (Debian bookworm, essential variant) + python3, qemu-utils, libmagic1,
#           ca-certificates; a venv at /opt/cdi holding the project's dependencies (wheels from
#           the package index); users qemu (107, the workers) and nonroot (65532, the control
#           plane). Cached in ~/.cache/cdi-py/images/base-<key>, the key being the hash of the
#           Debian package list, the apt sources, the dependency wheels and this recipe's
#           version: a commit that changes none of them reuses it.
#   app     the project's wheel installed into /opt/cdi (a few MB), rebuilt every run.
#   holder  the importer image only: the static cdi-holder (deploy/images/holder/holder.c),
#           the command of a registry node pull's containerDisk container.
# Each image's USER, ENTRYPOINT, CMD and EXPOSE are read from its deploy/images/Containerfile.*:
# the Containerfiles are the recipe, and podman/buildah users build the same images from them
# on top of this script's base (`--base-only`, then see the Containerfiles' headers).
#
# Output: DIR/oci (an OCI layout; refs cdi-base and cdi-<name>), DIR/wheels (the project's
# wheel), DIR/cdi-holder. --push copies each image to REGISTRY/cdi-<name>:TAG with skopeo.
# Reproducible: files and layers carry SOURCE_DATE_EPOCH (default: the last commit's time);
# the base is made from the Debian archive as it is when the base is built.
# Needs root (mmdebstrap --mode=root), mmdebstrap, umoci, skopeo, cc: scripts/setup.sh --images.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_RECIPE=1  # bump when the base's steps below change: the cache key includes it
APT_PACKAGES=(python3 python3-venv qemu-utils libmagic1 ca-certificates)
IMAGES=(controller webhook apiserver uploadproxy importer uploadserver cloner)
PYTHON_SITE=/opt/cdi/lib/python3.11/site-packages  # Debian bookworm's python3 is 3.11
IMAGE_PATH=/opt/cdi/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
BASE_EPOCH=1704067200  # the base's file times (2024-01-01): it is keyed by content, not commit

out=build/images
tag=latest
push=""
tls_verify=true
rebuild_base=""
base_only=""
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --insecure) tls_verify=false; shift ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --base-only) base_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in mmdebstrap umoci skopeo cc python3; do
  command -v "$tool" >/dev/null || {
    echo "images.sh: $tool is missing: run scripts/setup.sh --images" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "images.sh: needs root (mmdebstrap --mode=root)" >&2; exit 1; }

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo "$BASE_EPOCH")}
rfc3339() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cdi-py/images
work=$(mktemp -d /tmp/cdi-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
step() { echo "images.sh: [$((SECONDS - started)) s] $*"; }

# --- wheels: the project's and its dependencies' (pip's cache makes a rerun quick) ---------
step "wheels"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" wheel -q --wheel-dir "$work/wheels" .
mkdir -p "$work/deps" "$out/wheels"
rm -f "$out"/wheels/cdi_py-*.whl
for w in "$work"/wheels/*.whl; do
  case "$(basename "$w")" in
    cdi_py-*) cp "$w" "$out/wheels/" ;;
    *) mv "$w" "$work/deps/" ;;
  esac
done
app_wheel=$(ls "$out"/wheels/cdi_py-*.whl)
holder=$work/holder/usr/local/libexec
mkdir -p "$holder"
cc -static -Os -Wall -o "$holder/cdi-holder" deploy/images/holder/holder.c
strip "$holder/cdi-holder" && chmod 0555 "$holder/cdi-holder" && cp "$holder/cdi-holder" "$out/"

# --- base: cached by content -----------------------------------------------------------------
sources=(/etc/apt/sources.list.d/*.sources)
[[ -e ${sources[0]} ]] || sources=(/etc/apt/sources.list)
key=$( {
  echo "recipe $BASE_RECIPE ${APT_PACKAGES[*]} $IMAGE_PATH"
  cat "${sources[@]}"
  (cd "$work/deps" && sha256sum -- *.whl)
} | sha256sum | cut -c1-16)
base=$cache/base-$key
if [[ -n $rebuild_base || ! -f $base/done ]]; then
  step "base $key: mmdebstrap (cold: about 2 minutes)"
  rm -rf "$base" && mkdir -p "$base"
  mirror=()
  for s in "${sources[@]}"; do mirror+=("$s"); done
  SOURCE_DATE_EPOCH=$BASE_EPOCH mmdebstrap --quiet --variant=essential --mode=root --format=tar \
    --include="$(IFS=,; echo "${APT_PACKAGES[*]}")" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='mkdir -p "$1/tmp/wheels"' \
    --customize-hook="sync-in $work/deps /tmp/wheels" \
    --customize-hook='chroot "$1" python3 -m venv /opt/cdi' \
    --customize-hook='chroot "$1" sh -c "/opt/cdi/bin/pip install -q --no-cache-dir --no-index --no-deps /tmp/wheels/*.whl"' \
    --customize-hook='rm -rf "$1/tmp/wheels"' \
    --customize-hook='chroot "$1" /opt/cdi/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/cdi/lib' \
    --customize-hook='echo "qemu:x:107:107:qemu:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "qemu:x:107:" >> "$1/etc/group"' \
    --customize-hook='echo "nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "nonroot:x:65532:" >> "$1/etc/group"' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    bookworm "$work/base.tar" "${mirror[@]}"
  step "base: umoci"
  created=$(rfc3339 "$BASE_EPOCH")
  umoci init --layout "$base/oci"
  umoci new --image "$base/oci:cdi-base"
  umoci raw add-layer --image "$base/oci:cdi-base" --history.created "$created" \
    --history.created_by "scripts/images.sh base $key" "$work/base.tar"
  umoci config --image "$base/oci:cdi-base" --created "$created" --history.created "$created" \
    --config.env "PATH=$IMAGE_PATH" --config.workingdir / --config.cmd python
  touch "$base/done"
else
  step "base $key: cached ($base)"
fi
if [[ -n $base_only ]]; then
  rm -rf "$out/oci" && cp -a "$base/oci" "$out/oci"
  step "done: $out/oci:cdi-base (skopeo copy oci:$out/oci:cdi-base containers-storage:localhost/cdi-base:latest)"
  exit 0
fi

# --- app and holder layers --------------------------------------------------------------------
step "app layer"
layer_tar() {  # DIR OUT: a reproducible tar of DIR's contents
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$1" -cf "$2" .
}
app=$work/app
"$work/venv/bin/pip" install -q --no-deps --no-index --no-compile --target "$app$PYTHON_SITE" \
  "$app_wheel"
# Not reproducible, not needed: console scripts with the build venv's shebang (the images run
# python -m) and the build path of the wheel; RECORD forgets them too.
rm -rf "$app$PYTHON_SITE/bin" "$app$PYTHON_SITE"/cdi_py-*.dist-info/direct_url.json
sed -i -e '/^\.\.\/\.\.\/bin\//d' -e '/direct_url\.json,/d' "$app$PYTHON_SITE"/cdi_py-*.dist-info/RECORD
find "$app" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
python3 -m compileall -q --invalidation-mode unchecked-hash -s "$app" -p / "$app$PYTHON_SITE"
layer_tar "$app" "$work/app.tar"
layer_tar "$work/holder" "$work/holder.tar"

# --- one image per Containerfile ------------------------------------------------------------
rm -rf "$out/oci" && cp -a "$base/oci" "$out/oci"
created=$(rfc3339 "$SOURCE_DATE_EPOCH")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
for name in "${IMAGES[@]}"; do
  ref="$out/oci:cdi-$name"
  umoci tag --image "$out/oci:cdi-base" "cdi-$name"
  umoci raw add-layer --image "$ref" --history.created "$created" \
    --history.created_by "scripts/images.sh app $(basename "$app_wheel")" "$work/app.tar"
  if [[ $name == importer ]]; then
    umoci raw add-layer --image "$ref" --history.created "$created" \
      --history.created_by "scripts/images.sh cdi-holder" "$work/holder.tar"
  fi
  # USER, ENTRYPOINT, CMD, EXPOSE of deploy/images/Containerfile.<name>, as umoci flags
  mapfile -d '' flags < <(python3 scripts/containerfile.py umoci "deploy/images/Containerfile.$name")
  umoci config --image "$ref" --created "$created" --history.created "$created" \
    --config.label "org.opencontainers.image.title=cdi-$name" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    "${flags[@]}"
done
umoci gc --layout "$out/oci"
step "built: $(for n in "${IMAGES[@]}"; do printf 'cdi-%s ' "$n"; done)in $out/oci"

if [[ -n $push ]]; then
  for name in "${IMAGES[@]}"; do
    skopeo copy --quiet --dest-tls-verify="$tls_verify" "oci:$out/oci:cdi-$name" \
      "docker://$push/cdi-$name:$tag"
  done
  step "pushed to $push/cdi-*:$tag"
fi
