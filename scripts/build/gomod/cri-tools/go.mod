// Wrapper module that builds crictl, the CRI inspection tool.
module netclaim.local/build/cri-tools

go 1.26.0

require sigs.k8s.io/cri-tools v1.37.0
