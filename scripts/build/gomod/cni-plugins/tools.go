//go:build tools

// Package tools pins the CNI reference plugins built for the real-cluster node (macvlan, ipvlan and
// host-device for the secondary networks behind Multus).
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/host-device"
	_ "github.com/containernetworking/plugins/plugins/main/ipvlan"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/macvlan"
)
