//go:build tools

// Package tools pins the upstream snapshot-controller (kubernetes-csi/external-snapshotter,
// cmd/snapshot-controller) that build.sh compiles for the integration-test cluster, so that
// `go mod tidy` keeps every module it needs in go.mod and go.sum. The VolumeSnapshot CRDs the
// harness installs come from the client module of the same release (config/crd).
package tools

import (
	_ "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
