//go:build tools

// Package tools pins the Kubernetes commands that build.sh compiles (the control plane,
// kubectl, and the real node's kubelet and kube-proxy of the same release), so that `go mod tidy` keeps every module they need in go.mod
// and go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
