//go:build tools

// Package tools pins the kube-apiserver command so that `go mod tidy`
// records every module it needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
