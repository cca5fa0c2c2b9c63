//go:build tools

// Pins kwok for the operator_scale bench's fleet simulator; build-kwok.sh
// builds cmd/kwok from this module, lazily, when the bench first needs it
// (docs/decisions/fleet-simulator.md). Not part of `make setup`.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
