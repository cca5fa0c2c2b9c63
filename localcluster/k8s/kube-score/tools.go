//go:build tools

// Pins kube-score for `make kube-score`; built with
// `go build github.com/zegl/kube-score/cmd/kube-score`.
package tools

import _ "github.com/zegl/kube-score/cmd/kube-score"
