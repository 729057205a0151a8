"""The event path from journal to API: rules decide, the resolver finds claim and device, the mapper builds the status, the writer applies it."""
