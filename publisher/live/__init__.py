"""The live-interface watch: the entry follows what the sandbox's netns shows after ADD (links, carrier, addresses)."""
