"""How the live watch gets its two sockets in a netns: from the opener, or by entering it itself.

With `opener` set (the chart: a container of its own holds CAP_SYS_ADMIN) the
publisher asks that socket and needs no capability; without it (the systemd
install) it opens and enters the netns itself, under the same rules
(netnsfile.py). Either way the sockets come back unbound, and the netns's
identity is the one the publisher itself sees at the path: an opener that
saw another namespace there is not believed.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

from publisher.nsopen import wire
from publisher.nsopen.netnsfile import (
    AF_NETLINK,
    DEFAULT_NETNS_DIRS,
    NETLINK_ROUTE,
    NotANetns,
    NotWatchable,
    identity_of,
    open_netns,
    sockets_in,
)


@dataclass
class Opened:
    """Two unbound rtnetlink sockets in one netns, and that netns's (st_dev, st_ino)."""

    events: socket.socket
    reader: socket.socket
    ident: tuple[int, int]

    def close(self) -> None:
        self.events.close()
        self.reader.close()


def path_identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) the path shows now (never through a symlink), None when it is gone."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class NetnsAccess:
    dirs: tuple[str, ...] = DEFAULT_NETNS_DIRS
    opener: str = ""  # the opener's socket; empty: this process enters the netns itself
    timeout: float = 5.0  # seconds for one answer of the opener

    def open(self, path: str) -> Opened:
        """The sockets of the netns at `path`; OSError (NotWatchable, NotANetns) naming `path` if not."""
        return self._ask(path) if self.opener else self._here(path)

    def _here(self, path: str) -> Opened:
        fd = open_netns(path, self.dirs)
        try:
            ident = identity_of(fd)
            events, reader = sockets_in(fd, path)
        finally:
            os.close(fd)
        return Opened(events, reader, ident)

    def _ask(self, path: str) -> Opened:
        wire.encode({"op": "open", "netns": path})  # too long a path fails here, not at the opener
        answer, fds = self._exchange({"op": "open", "netns": path}, wire.FDS)
        if not answer.get("ok"):
            for fd in fds:
                os.close(fd)
            raise refused(answer, path)
        if len(fds) != wire.FDS:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EPROTO, "the netns opener sent no sockets", self.opener)
        events, reader = (socket.socket(AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE, fileno=fd) for fd in fds)
        opened = Opened(events, reader, (int(answer["dev"]), int(answer["ino"])))
        if path_identity(path) != opened.ident:
            opened.close()
            raise NotWatchable(errno.ESTALE, "the netns opener saw another namespace at this path", path)
        return opened

    def ready(self) -> str:
        """'' when the opener answers, else why not (the watch waits and asks again)."""
        try:
            answer, _fds = self._exchange({"op": "ping"}, 0)
        except OSError as exc:
            return f"the netns opener at {self.opener} does not answer: {exc.strerror or exc}"
        if not answer.get("ok"):
            return f"the netns opener at {self.opener} refuses: {answer.get('error', '')}"
        return ""

    def _exchange(self, request: dict, fds: int) -> tuple[dict, list[int]]:
        """One request and its answer; the opener must be root or this process's own uid."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(self.timeout)
            sock.connect(self.opener)
            _pid, uid = wire.peer_uid(sock)
            if uid not in (0, os.geteuid()):
                raise OSError(errno.EPERM, f"the netns opener socket is served by uid {uid}", self.opener)
            sock.send(wire.encode(request))
            data, got, _flags, _addr = socket.recv_fds(sock, wire.MAX_MESSAGE, max(fds, 1))
            try:
                return wire.decode(data), list(got)
            except (ValueError, TypeError):
                for fd in got:
                    os.close(fd)
                raise OSError(errno.EPROTO, "malformed answer from the netns opener", self.opener) from None


def refused(answer: dict, path: str) -> OSError:
    """The opener's refusal as the OSError the watch expects from opening `path` itself."""
    code = answer.get("errno") if isinstance(answer.get("errno"), int) else errno.EIO
    text = str(answer.get("error", ""))[:300]
    filename = str(answer.get("filename") or path)
    kind = answer.get("kind")
    if kind == "not-a-netns":
        return NotANetns(code, text, filename)
    if kind == "not-watchable":
        return NotWatchable(code, text, filename)
    return OSError(code, text, filename)
