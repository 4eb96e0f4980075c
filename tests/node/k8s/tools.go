//go:build tools

// The commands of a real node that the kit builds, so that `go mod tidy` keeps their modules.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
