"""Ask a process of this node its /healthz or /readyz over its unix socket, and know who answered.

A TCP port on the node's loopback is anyone's: any local account can bind 127.0.0.1:9467 before
the chain keeper does and answer `200 chained ...`. A unix socket in a root-owned directory can only
be created by root, and the kernel tells the client the uid of the process that listens on it
(SO_PEERCRED), so an answer is believed only from root (or this process's own uid). The heartbeat
asks the keeper this way (publisher/observe/nodelease.py), and the chart's exec probes run this
module: `python -m publisher.observe.localprobe SOCKET /healthz` exits 0 only when a trusted
process answered 200.

Standard library only, nothing of the publisher imported: an exec probe starts a Python process
every few seconds, and this keeps it to the interpreter's own start.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from dataclasses import dataclass

_UCRED = struct.Struct("3i")
MAX_ANSWER = 4096  # bytes read of an answer at most: a status line, a few headers, one line of body
TIMEOUT = 3.0  # seconds for the whole question; below the chart's exec probe timeoutSeconds (5)


@dataclass(frozen=True)
class Answer:
    status: int  # the HTTP status; 0 when what came back was no HTTP answer
    body: str
    uid: int  # the uid of the process listening on the socket, from the kernel

    @property
    def trusted(self) -> bool:
        """Root or ourselves: the only uids that can serve in the root-owned directory the chart uses."""
        return self.uid in (0, os.getuid())


def peer_uid(sock: socket.socket) -> int:
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1]


def ask(path: str, what: str = "/readyz", timeout: float = TIMEOUT) -> Answer:
    """GET `what` on the HTTP server listening at the unix socket `path`; OSError when nobody answers."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        uid = peer_uid(sock)
        sock.sendall(f"GET {what} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while len(data) < MAX_ANSWER:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {timeout:.0f}s")
            sock.settimeout(left)
            chunk = sock.recv(MAX_ANSWER - len(data))
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = head.split(b" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    return Answer(status, body.decode("utf-8", "replace"), uid)


def main(argv: list[str]) -> int:
    """The exec probe: 0 when the process at SOCKET (root's) answers 200 to PATH; 1 with the reason otherwise."""
    if len(argv) != 2 or argv[1] not in ("/healthz", "/readyz"):
        print("usage: python -m publisher.observe.localprobe SOCKET /healthz|/readyz", file=sys.stderr)
        return 2
    try:
        answer = ask(argv[0], argv[1])
    except OSError as exc:
        print(f"nothing answers at {argv[0]}: {exc}")
        return 1
    if not answer.trusted:
        print(f"{argv[0]} is served by uid {answer.uid}, not root: not believed")
        return 1
    print(answer.body.strip()[:300] or answer.status)
    return 0 if answer.status == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
