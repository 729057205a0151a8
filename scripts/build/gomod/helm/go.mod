// Wrapper module that builds the helm CLI for chart lint, template and install tests.
module netclaim.local/build/helm

go 1.26.0

require helm.sh/helm/v3 v3.22.0
