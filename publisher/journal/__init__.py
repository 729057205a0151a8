"""The node-local journal: what each attachment last was, in which order events are applied, and what survives
a crash."""
