//go:build tools

// Package tools pins the registry command.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
