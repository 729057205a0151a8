"""The event path from journal to API: the workers drive events through the rules, the resolver finds claim
and device, the mapper builds the status, the writer applies it."""
