// Wrapper module that builds containerd 2.x, its runc shim and ctr without cgo.
module netclaim.local/build/containerd

go 1.26.0

require github.com/containerd/containerd/v2 v2.4.2
