// Wrapper module that builds the etcd server binary from go.etcd.io/etcd/server/v3.
module netclaim.local/build/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.16
