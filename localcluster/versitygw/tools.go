//go:build tools

// Pins versitygw, the S3 gateway the s3:// model-source tests run on loopback
// with its posix backend; build-binaries.sh builds it from this module
// (docs/decisions/model-sources.md).
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
