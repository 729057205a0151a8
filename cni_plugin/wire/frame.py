"""Length-prefixed frames: how an event and its reply travel over the publisher's socket.

Every message is a 4-byte big-endian length followed by that many bytes
of UTF-8 JSON (an object). A peer that sends a frame larger than MAX_FRAME, or a
frame that is not a JSON object, gets an error reply and the connection is
closed. An event frame's body holds the same JSON object a spool file holds.

One event is at most MAX_EVENT_BYTES encoded and MAX_JSON_DEPTH levels deep,
whichever channel carries it: the plugin refuses to hand off a bigger one, the
publisher's socket reads at most MAX_FRAME (that cap plus the request's
envelope) and `spool.read_spool` checks the file's size before reading it, so an
oversized event is refused before anything parses it.

Requests (client -> publisher):
    {"kind": "event", "event": {...Event...}}
    {"kind": "status"}
Replies (publisher -> client):
    {"ok": true, "id": "<event id>"}      event committed to the journal
    {"ok": false, "error": "..."}         rejected; the client may spool it
    {"ok": true, "status": {...}}         answer to a status request
"""

from __future__ import annotations

from ..lean.jsonio import dumps
from .event import MAX_EVENT_BYTES, Event, WireError, decode_body

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    class Receiver(Protocol):
        """What read_frame needs of a socket: its blocking recv (a socket.socket, the plugin's _socket one)."""

        def recv(self, bufsize: int, /) -> bytes: ...

DEFAULT_SOCKET = "/run/netclaim/publisher.sock"
_ENVELOPE = 64  # {"kind":"event","event":...}
MAX_FRAME = MAX_EVENT_BYTES + _ENVELOPE  # what the publisher reads from a client: one request
MAX_REPLY_FRAME = 1 << 20  # replies (a status listing can be larger than one event)
_HEADER_SIZE = 4


def event_frame(data: bytes) -> bytes:
    """The request frame for an event already encoded by encode_event (no second encoding)."""
    body = b'{"kind":"event","event":' + data + b"}"
    return len(body).to_bytes(_HEADER_SIZE, "big") + body


def encode_frame(message: dict, max_frame: int = MAX_REPLY_FRAME) -> bytes:
    body = dumps(message).encode()
    if len(body) > max_frame:
        raise WireError(f"frame of {len(body)} bytes exceeds {max_frame}")
    return len(body).to_bytes(_HEADER_SIZE, "big") + body


def _recv_exact(sock: Receiver, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            raise WireError("connection closed mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: Receiver, max_frame: int = MAX_REPLY_FRAME) -> dict:
    """Read one frame from a blocking socket.

    Raises WireError for an oversized, truncated or non-object frame and
    EOFError when the peer closed cleanly before a new frame. The length is
    checked before the body is read: a server reading requests passes
    MAX_FRAME (one event and its envelope); clients reading replies keep the
    default.
    """
    first = sock.recv(_HEADER_SIZE)
    if not first:
        raise EOFError("peer closed")
    header = first + (_recv_exact(sock, _HEADER_SIZE - len(first)) if len(first) < _HEADER_SIZE else b"")
    length = int.from_bytes(header, "big")
    if length > max_frame:
        raise WireError(f"frame of {length} bytes exceeds {max_frame}")
    return decode_body(_recv_exact(sock, length))


def event_request(event: Event) -> dict:
    return {"kind": "event", "event": event.to_dict()}
