"""A real container runtime on one machine, for the e2e tests, the demo and the benchmarks.

Kubernetes runs netclaim from inside containerd's RunPodSandbox; this package
starts a private containerd (own config, root, state and socket under a temp
dir), gives it a locally built sandbox image and a CNI conflist, and drives
the CRI RuntimeService over gRPC the way kubelet does. Everything it starts
or creates is tracked so it can be stopped and removed even after a failure.
"""
