//go:build tools

// Pins the CNCF distribution registry, the authenticated OCI registry the
// cluster pulls its images and chart from; build-binaries.sh builds it from
// this module (docs/decisions/registry.md).
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
