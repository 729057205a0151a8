// Wrapper module that builds the OCI distribution registry the release push is tested against.
module netclaim.local/build/registry

go 1.26.0

require github.com/distribution/distribution/v3 v3.1.2
