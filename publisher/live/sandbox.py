"""Two rtnetlink sockets in one sandbox's netns: one told of changes, one that reads.

A socket keeps its netns alive: while the publisher holds these, the
namespace and every interface in it (a VF that should return to the host)
outlive the sandbox. So the netns is named by its path *and* the identity of
the nsfs inode the path showed when the sockets were opened; `vanished()` is
true as soon as the path is gone or shows another namespace (the runtime
unmounted and removed it, whether or not a DEL came), and the watcher then
closes both sockets at once, which frees the namespace.

The project's own rtnetlink client (cni_plugin/lean/netlink.py) does the reading:
pyroute2 would add ~22 MiB to the publisher's resident memory on import,
more than the watch may cost in all.
"""

from __future__ import annotations

import errno
import socket

from cni_plugin.lean.netlink import IFF_UP, RtNetlink, format_cidr, unusable
from publisher import limits
from publisher.live.status import Observed
from publisher.nsopen.access import NetnsAccess, path_identity
from publisher.nsopen.netnsfile import NotANetns, NotWatchable

__all__ = ["NotANetns", "NotWatchable", "Sandbox", "identity"]

AF_NETLINK = 16
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
IFF_LOWER_UP = 0x10000
RCVBUF = 1 << 18


def identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) the path shows now (never through a symlink), None when it is gone."""
    return path_identity(path)


class Sandbox:
    """The sockets of one netns; created and used by the watcher's thread only."""

    def __init__(self, path: str, access: NetnsAccess | None = None) -> None:
        self.path = path
        self.access = access or NetnsAccess()
        self.ident: tuple[int, int] | None = None
        self.events: socket.socket | None = None
        self.reader: RtNetlink | None = None
        self._open()

    def _open(self) -> None:
        """Two rtnetlink sockets made in the netns (by the opener, or by entering it here:
        publisher/nsopen), bound here: joining the link and address groups needs no capability,
        and the groups are those of the netns the socket was made in."""
        opened = self.access.open(self.path)
        try:
            opened.events.setblocking(False)
            opened.events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            opened.events.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
            opened.reader.bind((0, 0))
        except BaseException:
            opened.close()
            raise
        self.events, self.reader, self.ident = opened.events, RtNetlink(opened.reader), opened.ident

    def fileno(self) -> int:
        assert self.events is not None
        return self.events.fileno()

    def vanished(self) -> bool:
        return identity(self.path) != self.ident

    def drain(self) -> int:
        """Read every queued notification; their content does not matter (the next read
        takes the whole state). An overflow (ENOBUFS) is a change too."""
        n = 0
        assert self.events is not None
        while True:
            try:
                if not self.events.recv(65536):
                    return n
            except BlockingIOError:
                return n
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
            n += 1

    def observe(self, ifname: str) -> Observed:
        """The interface `ifname` now: flags, MAC, global addresses in canonical form, the usable
        ones apart from those the kernel flags tentative, DAD-failed or deprecated (`unusable`).

        Bounded whatever the netns holds: at most limits.LIVE_MAX_ADDRESSES addresses are read
        (`more` says there were others), de-duplicated with a set. A read cut short leaves the
        kernel's dump unfinished on the reading socket, which then takes no other dump: it is
        replaced at once (`_renew_reader`), a constant cost instead of reading the rest."""
        if self.reader is None:
            self._renew_reader()
        assert self.reader is not None
        link = self.reader.get_link(ifname)
        if link is None:
            return Observed(ifname=ifname, present=False)
        found, complete = self.reader.some_addresses(link.index, limits.LIVE_MAX_ADDRESSES)
        if not complete:
            try:
                self._renew_reader()
            except OSError:  # kept reader-less: the next observe tries again, the path check decides
                pass
        ips: list[str] = []
        seen: set[str] = set()
        unusable_ips: dict[str, str] = {}
        for family, raw, prefixlen, flags in found:
            if family == socket.AF_INET6 and raw[0] == 0xFE and raw[1] & 0xC0 == 0x80:
                continue  # link-local: every IPv6 interface has one; no CNI result names it
            try:
                cidr = limits.canonical_cidr(format_cidr(family, raw, prefixlen))
            except ValueError:
                continue
            why = unusable(flags)
            if why:
                unusable_ips[cidr] = why
            elif cidr not in seen:
                seen.add(cidr)
                ips.append(cidr)
        return Observed(ifname=link.name, present=True, up=bool(link.flags & IFF_UP),
                        carrier=bool(link.flags & IFF_LOWER_UP), mac=link.mac.lower(), ips=ips, more=not complete,
                        unusable=unusable_ips)

    def _renew_reader(self) -> None:
        """Replace the reading socket with a new one in this same netns, opened the way the sandbox
        was (its path, checked against the namespace first opened). On failure there is no reader,
        and the next observe tries again; meanwhile the path check decides whether the netns is gone."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        fresh = type(self)(self.path, self.access)
        try:
            if fresh.ident != self.ident:
                raise OSError(errno.ESTALE, f"{self.path} shows another network namespace")
            self.reader, fresh.reader = fresh.reader, None
        finally:
            fresh.close()

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
