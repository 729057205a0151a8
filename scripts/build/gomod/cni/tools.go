//go:build tools

// Package tools pins cnitool.
package tools

import _ "github.com/containernetworking/cni/cnitool"
