"""The chain keeper, a separate program: it inserts and removes netclaim in the node's CNI conflist
and decides when uninstall may clean the node (its command: publisher/keeper/command.py)."""
