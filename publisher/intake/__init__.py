"""Events in from the plugin: the unix-socket server and the spool reader, both ending in the journal."""
