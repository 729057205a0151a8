// Wrapper module that builds the CNI reference plugins the real-cluster node chains
// (bridge, host-local, loopback) at a release that speaks CNI 1.1.0 (STATUS, GC):
// the version containerd 2.4.2 itself pins. Debian 12's plugins stop at CNI 1.0.0.
module netclaim.local/build/cni-plugins

go 1.26.0

require github.com/containernetworking/plugins v1.9.1
