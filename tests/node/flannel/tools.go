//go:build tools

// The commands of flannel's image (images/Dockerfile in its module): flanneld and install-conf.
package tools

import (
	_ "github.com/flannel-io/flannel"
	_ "github.com/flannel-io/flannel/cmd/install_conf"
)
