"""Run an NRI plugin on a connection to one containerd's NRI socket.

    nri_attach.py SOCKET PROGRAM [ARGS...]

An NRI plugin built on the NRI stub dials the host-wide /var/run/nri/nri.sock,
unless the runtime hands it an already connected socket: the file descriptor
number in NRI_PLUGIN_SOCKET (what containerd does for the plugins it launches
itself). Each test node runs its own containerd with its own NRI socket under
its cluster directory, so this connects to that socket and execs the plugin
with the connection as NRI_PLUGIN_SOCKET: no host-wide socket, and two
clusters can run side by side. exec keeps the pid, so the caller's pid file
stays the plugin's. The plugin cannot reconnect by itself when containerd
restarts (the descriptor is dead then): restart the plugin too.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def connect(path: str, timeout: float = 30.0) -> socket.socket:
    """A connection to the NRI socket, waiting for containerd to create it."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    fd = connect(argv[1]).detach()
    os.set_inheritable(fd, True)
    os.environ["NRI_PLUGIN_SOCKET"] = str(fd)
    os.execv(argv[2], argv[2:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
