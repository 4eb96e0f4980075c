//go:build tools

// flannel's CNI plugin. Its own module (github.com/flannel-io/cni-plugin) is refused by the Go module
// proxy; the same plugin lived in containernetworking/plugins until v0.9.1, taken here with
// containernetworking/cni raised to v1.1.2, so that it takes CNI spec 1.0.0, which the conflist of
// flannel's current manifest names (with cni v0.8.1 it refuses it: "incompatible CNI versions").
// `go mod tidy` cannot keep this go.mod: the plugin's Windows-only imports need the old cni.
package tools

import _ "github.com/containernetworking/plugins/plugins/meta/flannel"
