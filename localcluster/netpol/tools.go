//go:build tools

// Pins kube-router, whose network policy controller (iptables + ipset)
// enforces NetworkPolicy in localcluster; built with
// `go build github.com/cloudnativelabs/kube-router/v2/cmd/kube-router` and run
// with only its firewall enabled (docs/decisions/localcluster.md says why not
// kube-network-policies).
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
