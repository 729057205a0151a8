"""Opening a pod's netns for the live watch: the one step that needs CAP_SYS_ADMIN, kept apart.

    publisher (no capability; listens on the network)          opener (SYS_ADMIN only; no listener,
        Sandbox ─▶ NetnsAccess.open(path) ── unix socket ─▶      no API token, no journal)
                                          ◀─ 2 netlink fds ──    open under the netns dir, nsfs?,
                                             + (st_dev, st_ino)  setns in a throwaway thread, socket() x2

A netlink socket stays in the namespace it was created in, so the sockets the
opener made keep reading that netns in the publisher. Without an opener
configured the publisher does the same steps itself (the systemd install).
Either way a netns is opened only by name in a configured netns directory,
never through a symlink, and only when the file is an nsfs inode.
"""
