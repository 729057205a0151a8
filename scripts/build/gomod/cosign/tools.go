//go:build tools

// Package tools pins the cosign command.
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
