//go:build tools

// Pins Prometheus for localcluster's monitoring addon; build-binaries.sh
// builds cmd/prometheus from this module with only Kubernetes discovery
// compiled in (docs/decisions/monitoring.md).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
