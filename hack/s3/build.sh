#!/usr/bin/env bash
# Build versitygw, a real S3 gateway over a directory (github.com/versity/versitygw, Apache-2.0),
# for the S3 import tests: the importer's SigV4 requests, ranges and error documents meet a real
# S3 implementation on loopback (testkit/s3server.py starts it). Built from the Go module proxy
# at a pinned version; no container, no registry.
#
# Output: hack/s3/_build/bin/versitygw (git-ignored), cached as hack/lib/go-install-cached.sh
# describes (a stamp here, the binary also under ~/.cache/cdi-py/versitygw/<hash>/, so another
# worktree copies it in a second). A cold build takes a few minutes on two cores.
#   hack/s3/build.sh           build if inputs changed
#   hack/s3/build.sh --force   rebuild regardless of the stamp
set -euo pipefail
source "$(dirname "$0")/../lib/go-install-cached.sh"
go_install_cached hack/s3 versitygw github.com/versity/versitygw/cmd/versitygw v1.8.0 "$0" "${1:-}"
