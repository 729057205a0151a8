"""A minimal rtnetlink client: read and change one link, list its addresses.

pyroute2 would do this, but its package import costs ~350 ms and ~25 MB here
(it imports everything from its `__init__`), 35x the interpreter start-up; the
plugin needs six message types, so it speaks them with `_struct` (what the
`struct` module re-exports) over an AF_NETLINK socket. Tests verify the
results independently with pyroute2.
"""

from __future__ import annotations

import _socket
import _struct

from . import posixos as os

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator
    from typing import TypeVar

    T = TypeVar("T")

AF_NETLINK = 16
NETLINK_ROUTE = 0

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10  # set on dump parts when the table changed mid-dump
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12  # Linux 4.20+: a dump request's header filters (ifa_index) are applied
EINVAL = 22
ENOPROTOOPT = 92
MSG_PEEK = 0x2
MSG_TRUNC = 0x20
EINTR = 4
EMSGSIZE = 90
NLM_F_CREATE = 0x400
NLM_F_EXCL = 0x200
NLM_F_APPEND = 0x800
NLA_F_NESTED = 0x8000

RTM_NEWLINK = 16
RTM_GETLINK = 18
RTM_SETLINK = 19
RTM_GETADDR = 22
RTM_NEWLINKPROP = 108
RTM_DELLINKPROP = 109

IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_TXQLEN = 13
IFLA_EXT_MASK = 29
IFLA_PROP_LIST = 52
IFLA_ALT_IFNAME = 53
RTEXT_FILTER_SKIP_STATS = 1 << 3
RTMGRP_IPV6_IFADDR = 0x100  # told when an IPv6 address is added, removed or changes flags (DAD's outcome)

IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_FLAGS = 8  # u32: all of an address's flags (ifa_flags, one byte, holds only the low eight)
IFF_UP = 0x1

# An address's flags that make it unusable, in the order an address is judged by them.
IFA_F_DADFAILED = 0x08  # duplicate address detection found another host holding it
IFA_F_TENTATIVE = 0x40  # duplicate address detection has not finished: not yet the interface's
IFA_F_DEPRECATED = 0x20  # its preferred lifetime ended: not for new connections
DADFAILED = "dadfailed"
TENTATIVE = "tentative"
DEPRECATED = "deprecated"
UNUSABLE = ((IFA_F_DADFAILED, DADFAILED), (IFA_F_TENTATIVE, TENTATIVE), (IFA_F_DEPRECATED, DEPRECATED))

_NLMSGHDR = _struct.Struct("=IHHII")
_IFINFOMSG = _struct.Struct("=BxHiII")
_IFADDRMSG = _struct.Struct("=BBBBI")
_NLATTR = _struct.Struct("=HH")
_U32 = _struct.Struct("=I")
_ERR = _struct.Struct("=i")


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (_align(length) - length)


def parse_attrs(data: bytes, offset: int = 0) -> dict[int, list[bytes]]:
    """Attributes of one message body, by type (nested flag stripped)."""
    attrs: dict[int, list[bytes]] = {}
    end = len(data)
    while offset + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size:
            break
        attrs.setdefault(kind & ~NLA_F_NESTED, []).append(data[offset + _NLATTR.size: offset + length])
        offset += _align(length)
    return attrs


def format_mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def mac_bytes(mac: str) -> bytes:
    return bytes(int(p, 16) for p in mac.split(":"))


class Link:
    """What the plugin reads about one interface."""

    __slots__ = ("index", "name", "flags", "mtu", "txqlen", "mac", "alt_names")

    def __init__(self, index: int, name: str, flags: int, mtu: int, txqlen: int, mac: str,
                 alt_names: list[str]) -> None:
        self.index = index
        self.name = name
        self.flags = flags
        self.mtu = mtu
        self.txqlen = txqlen
        self.mac = mac
        self.alt_names = alt_names

    @property
    def up(self) -> bool:
        return bool(self.flags & IFF_UP)


class DumpInterrupted(Exception):
    """The kernel flagged a dump part NLM_F_DUMP_INTR: the table changed while it was read."""


class RtNetlink:
    """One NETLINK_ROUTE socket in the netns that was current when it was opened.

    Replies are read with a peek first (MSG_PEEK|MSG_TRUNC returns a datagram's
    real size), so a reply larger than the buffer grows the buffer instead of
    being silently cut; beyond MAX_BUFFER it is an error (EMSGSIZE). A dump the
    kernel marks interrupted is read again, up to DUMP_RETRIES times.
    """

    BUFFER = 1 << 16
    MAX_BUFFER = 1 << 22
    DUMP_RETRIES = 5

    def __init__(self, sock: "_socket.socket | None" = None) -> None:
        """A new socket in the current netns, or `sock`: a bound NETLINK_ROUTE socket made in
        another netns (the publisher's live watch is handed them), whose netns it then reads."""
        if sock is None:
            sock = _socket.socket(AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, NETLINK_ROUTE)
            sock.bind((0, 0))
        self.sock = sock
        self.seq = 0
        self._buf = bytearray(self.BUFFER)
        self._strict: bool | None = None  # None: NETLINK_GET_STRICT_CHK not tried yet on this socket

    def _recv(self) -> bytes:
        """One whole datagram (see the class docstring for truncation)."""
        size = self.sock.recv_into(self._buf, len(self._buf), MSG_PEEK | MSG_TRUNC)
        if size > len(self._buf):
            if size > self.MAX_BUFFER:
                self.sock.recv_into(self._buf, len(self._buf))  # drop it
                raise OSError(EMSGSIZE, f"netlink reply of {size} bytes exceeds {self.MAX_BUFFER}")
            self._buf = bytearray(size)
        got = self.sock.recv_into(self._buf, len(self._buf))
        return bytes(self._buf[:got])

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RtNetlink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self.seq += 1
        self.sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags | NLM_F_REQUEST, self.seq, 0) + body)
        return self.seq

    def _replies(self, seq: int, single: bool) -> Iterator[tuple[int, bytes]]:
        """Yield (type, body) for our sequence until DONE, the final ack/error,
        or (`single`: a plain GET without ack) the first reply. Raises
        DumpInterrupted at the end of a dump whose parts carried NLM_F_DUMP_INTR."""
        interrupted = False
        while True:
            data = self._recv()
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, flags, mseq, _pid = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size or offset + length > len(data):
                    raise OSError(EMSGSIZE, "malformed netlink message length")
                body = data[offset + _NLMSGHDR.size: offset + length]
                offset += _align(length)
                if mseq != seq:
                    continue
                interrupted = interrupted or bool(flags & NLM_F_DUMP_INTR)
                if kind == NLMSG_DONE:
                    if interrupted:
                        raise DumpInterrupted()
                    return
                if kind == NLMSG_ERROR:
                    (error,) = _ERR.unpack_from(body)
                    if error:
                        raise OSError(-error, os.strerror(-error))
                    return
                yield kind, body
                if single:
                    return

    def request(self, kind: int, body: bytes, flags: int = NLM_F_ACK) -> list[bytes]:
        single = not flags & (NLM_F_ACK | NLM_F_DUMP)
        if not flags & NLM_F_DUMP:
            return [b for _k, b in self._replies(self._send(kind, flags, body), single)]
        return self._dump(kind, flags, body, lambda replies: [b for _k, b in replies])

    def _dump(self, kind: int, flags: int, body: bytes, collect: Callable[[Iterator[tuple[int, bytes]]], T]) -> T:
        """`collect` over a dump's replies, from the start again while the kernel says the table
        changed mid-dump (DUMP_RETRIES times at most)."""
        for _attempt in range(self.DUMP_RETRIES):
            try:
                return collect(self._replies(self._send(kind, flags, body), False))
            except DumpInterrupted:
                continue
        raise OSError(EINTR, f"netlink dump interrupted {self.DUMP_RETRIES} times in a row")

    # ------------------------------------------------------------------ links

    def get_link(self, name: str) -> Link | None:
        """The link called `name` (or with that alt name), None when absent."""
        body = _IFINFOMSG.pack(0, 0, 0, 0, 0) + attr(IFLA_EXT_MASK, _U32.pack(RTEXT_FILTER_SKIP_STATS))
        body += attr(IFLA_IFNAME, os.fsencode(name) + b"\0")
        try:
            replies = self.request(RTM_GETLINK, body, flags=0)
        except OSError as exc:
            if exc.errno in (19, 2):  # ENODEV, ENOENT
                return None
            raise
        if not replies:
            return None
        return self._link(replies[0])

    @staticmethod
    def _link(body: bytes) -> Link:
        _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(body)
        attrs = parse_attrs(body, _IFINFOMSG.size)
        alt_names = []
        for prop in attrs.get(IFLA_PROP_LIST, []):
            alt_names += [os.fsdecode(a.rstrip(b"\0")) for a in parse_attrs(prop).get(IFLA_ALT_IFNAME, [])]
        first = lambda key, default=b"": attrs.get(key, [default])[0]  # noqa: E731
        return Link(
            index=index,
            name=os.fsdecode(first(IFLA_IFNAME).rstrip(b"\0")),
            flags=flags,
            mtu=_U32.unpack(first(IFLA_MTU, b"\0\0\0\0"))[0],
            txqlen=_U32.unpack(first(IFLA_TXQLEN, b"\0\0\0\0"))[0],
            mac=format_mac(first(IFLA_ADDRESS)),
            alt_names=alt_names,
        )

    def set_link(self, index: int, *, mtu: int | None = None, txqlen: int | None = None,
                 mac: str | None = None, up: bool | None = None) -> None:
        flags = change = 0
        if up is not None:
            change = IFF_UP
            flags = IFF_UP if up else 0
        body = _IFINFOMSG.pack(0, 0, index, flags, change)
        if mtu is not None:
            body += attr(IFLA_MTU, _U32.pack(mtu))
        if txqlen is not None:
            body += attr(IFLA_TXQLEN, _U32.pack(txqlen))
        if mac is not None:
            body += attr(IFLA_ADDRESS, mac_bytes(mac))
        self.request(RTM_SETLINK, body)

    def set_mac(self, link: Link, mac: str) -> None:
        """Set the MAC; drivers without live address change need the link down."""
        try:
            self.set_link(link.index, mac=mac)
        except OSError as exc:
            if exc.errno != 16 or not link.up:  # EBUSY
                raise
            self.set_link(link.index, up=False)
            try:
                self.set_link(link.index, mac=mac)
            finally:
                self.set_link(link.index, up=True)

    def alt_name(self, index: int, name: str, add: bool) -> None:
        body = _IFINFOMSG.pack(0, 0, index, 0, 0)
        body += attr(IFLA_PROP_LIST | NLA_F_NESTED, attr(IFLA_ALT_IFNAME, os.fsencode(name) + b"\0"))
        flags = NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL | NLM_F_APPEND if add else 0)
        self.request(RTM_NEWLINKPROP if add else RTM_DELLINKPROP, body, flags=flags)

    # ------------------------------------------------------------------ addresses

    def addresses(self, index: int) -> list[tuple[int, bytes, int, int]]:
        """(family, packed address, prefix length, flags) of every address on link `index`: the whole
        dump, filtered here (the plugin's way: its socket is never switched to strict checking)."""
        return self._address_dump(_IFADDRMSG.pack(0, 0, 0, 0, 0), index, 0)[0]

    def some_addresses(self, index: int, limit: int) -> tuple[list[tuple[int, bytes, int, int]], bool]:
        """(addresses of link `index`, complete): at most `limit` of them (0: all).

        The kernel is asked for that link's addresses only (NETLINK_GET_STRICT_CHK with
        ifa_index), so a netns's other interfaces cost nothing; a kernel that refuses it gets
        the whole dump, filtered here, and then `limit` counts every address read. Past
        `limit` the reply is not read further and `complete` is False: the dump is left
        unfinished, so this socket can make no other dump request (the caller replaces it).
        """
        strict = self._strict_check()
        body = _IFADDRMSG.pack(0, 0, 0, 0, index if strict else 0)
        try:
            return self._address_dump(body, index, limit)
        except OSError as exc:
            if not strict or exc.errno != EINVAL:
                raise
            self._strict = False  # the kernel takes the option but not the filter: filter here
            return self._address_dump(_IFADDRMSG.pack(0, 0, 0, 0, 0), index, limit)

    def _strict_check(self) -> bool:
        if self._strict is None:
            try:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                self._strict = True
            except OSError as exc:
                if exc.errno not in (ENOPROTOOPT, EINVAL):
                    raise
                self._strict = False
        return self._strict

    def _address_dump(self, body: bytes, index: int, limit: int) -> tuple[list[tuple[int, bytes, int, int]], bool]:
        def collect(replies: Iterator[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes, int, int]], bool]:
            out: list[tuple[int, bytes, int, int]] = []
            for read, (_kind, reply) in enumerate(replies, 1):
                if limit and read > limit:
                    return out, False
                family, prefixlen, flags, _scope, ifindex = _IFADDRMSG.unpack_from(reply)
                if ifindex != index:
                    continue
                attrs = parse_attrs(reply, _IFADDRMSG.size)
                raw = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS, [b""]))[0]
                wide = attrs.get(IFA_FLAGS, [b""])[0]
                if len(wide) >= _U32.size:  # Linux 3.14+: the whole set (ifa_flags holds the low byte)
                    flags = _U32.unpack_from(wide)[0]
                if raw:
                    out.append((family, raw, prefixlen, flags))
            return out, True

        return self._dump(RTM_GETADDR, NLM_F_DUMP, body, collect)


def ipv6_address_events() -> _socket.socket:
    """A socket told of every IPv6 address change in the current netns: a DAD that ends, either
    way, is one (the kernel announces the address again with its new flags)."""
    sock = _socket.socket(AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.bind((0, RTMGRP_IPV6_IFADDR))
    except BaseException:
        sock.close()
        raise
    return sock


def unusable(flags: int) -> str:
    """Why an address with these flags cannot be used ("dadfailed", "tentative", "deprecated"), or "".

    A tentative address does not answer yet and a DAD-failed one never will (the kernel marks it
    both); a deprecated one still answers but is on its way out. Consumers send traffic to what an
    entry lists, so none of them is listed.
    """
    for bit, name in UNUSABLE:
        if flags & bit:
            return name
    return ""


def parse_cidr(cidr: str) -> tuple[int, bytes, int] | None:
    """'10.1.0.5/16' -> (family, packed, 16); None when unparsable."""
    address, _sep, prefix = cidr.partition("/")
    family = _socket.AF_INET6 if ":" in address else _socket.AF_INET
    try:
        return (family, _socket.inet_pton(family, address), int(prefix))
    except (OSError, ValueError):
        return None


def format_cidr(family: int, raw: bytes, prefixlen: int) -> str:
    return f"{_socket.inet_ntop(family, raw)}/{prefixlen}"
