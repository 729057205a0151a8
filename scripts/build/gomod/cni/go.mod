// Wrapper module that builds cnitool, libcni's own runner: the library that
// containerd and CRI-O both use to execute CNI plugins.
module netclaim.local/build/cni

go 1.26.0

require github.com/containernetworking/cni v1.3.1
