// Wrapper module that builds the cosign CLI that signs and verifies releases in a registry.
module netclaim.local/build/cosign

go 1.26.0

require github.com/sigstore/cosign/v2 v2.6.5
