#!/usr/bin/env bash
# Build fake-gcs-server, the GCS emulator Google's client libraries are tested with
# (github.com/fsouza/fake-gcs-server, BSD-2-Clause), for the GCS import tests: the importer's
# media downloads, ranges and error answers meet a real GCS implementation on loopback
# (testkit/gcsserver.py starts it). Built from the Go module proxy at a pinned version; no
# container, no registry.
#
# Output: hack/gcs/_build/bin/fake-gcs-server (git-ignored), cached as hack/lib/go-install-cached.sh
# describes (a stamp here, the binary also under ~/.cache/cdi-py/fake-gcs-server/<hash>/).
# A cold build takes a minute or two on two cores.
#   hack/gcs/build.sh           build if inputs changed
#   hack/gcs/build.sh --force   rebuild regardless of the stamp
set -euo pipefail
source "$(dirname "$0")/../lib/go-install-cached.sh"
go_install_cached hack/gcs fake-gcs-server github.com/fsouza/fake-gcs-server v1.56.1 "$0" "${1:-}"
