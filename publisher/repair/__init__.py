"""Background repair that does not ride on an event: start-up resync, the safety net, claim windows and
unchained-pod detection."""
