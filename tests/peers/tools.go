//go:build tools

// Package peers pins the peer programs scripts/peers-karpenter builds; it has no code of its own.
// The build tag keeps this file out of every build: it only makes `go mod tidy` record the
// modules (and their checksums) that `go build sigs.k8s.io/karpenter/kwok` needs.
package peers

import (
	// Karpenter's kwok cloud provider: the controller that turns NodeClaims into kwok Nodes.
	_ "sigs.k8s.io/karpenter/kwok"
)
