#!/usr/bin/env bash
# Install the runtime and run the main job on an embedded default, no cluster needed:
# generate a qcow2 image, serve it over loopback HTTP and import it with `cdi import` into
# ./_work/demo/disk.img, showing progress and printing the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/cdi demo "$@"
