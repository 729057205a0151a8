"""What operators see: metrics, health and readiness, Kubernetes Events and the status report."""
