//go:build tools

// Pins the Prometheus Operator for localcluster's monitoring addon:
// build-binaries.sh builds cmd/operator and cmd/prometheus-config-reloader
// from this module and copies the CRDs out of its module zip.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
