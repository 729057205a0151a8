"""The opener's unix socket: one request and one answer per connection (SOCK_SEQPACKET).

    request   {"op": "open", "netns": PATH}  or  {"op": "ping"}
    answer    {"ok": true, "dev": N, "ino": N} + SCM_RIGHTS [events fd, reader fd]
              {"ok": false, "errno": N, "error": TEXT, "kind": "" | "not-watchable" | "not-a-netns",
               "filename": PATH}

Each side knows the other by SO_PEERCRED, never by what it says: the opener
serves root and the uids it was given, the publisher takes fds only from a
root opener (or one of its own uid).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAX_MESSAGE = 4096
FDS = 2
_UCRED = struct.Struct("=iII")  # pid, uid, gid


def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel saw it connect."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data.decode())
    if not isinstance(message, dict):
        raise TypeError("not an object")
    return message
