//go:build tools

// Pins containerd for localcluster; built by ../build-binaries.sh with
// `go build github.com/containerd/containerd/v2/cmd/...`.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
