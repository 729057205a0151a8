"""The rtnetlink client's edge cases: interrupted dumps and replies larger
than the receive buffer.

NLM_F_DUMP_INTR cannot be provoked on demand (the kernel sets it when a table
changes mid-dump), so those tests feed crafted kernel messages to the real
parser (a fake of the kernel's side, named as such). Truncation is real: a
real netlink socket in a real netns with a deliberately tiny buffer.
"""

from __future__ import annotations

import errno
import struct

import pytest

from cni_plugin.lean import netlink
from cni_plugin.lean.netns import NetNS

HDR = struct.Struct("=IHHII")


def _msg(kind: int, seq: int, body: bytes = b"", flags: int = 0) -> bytes:
    data = HDR.pack(HDR.size + len(body), kind, flags, seq, 0) + body
    return data + b"\0" * (netlink._align(len(data)) - len(data))


class CraftedKernel(netlink.RtNetlink):
    """FAKE kernel side: `dumps` lists, per request, the datagrams the kernel would answer with."""

    def __init__(self, dumps: list[list[list[tuple[int, bytes, int]]]]) -> None:
        super().__init__()
        self.dumps = dumps
        self.requests = 0
        self.pending: list[bytes] = []

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self.seq += 1
        answer = self.dumps[min(self.requests, len(self.dumps) - 1)]
        self.requests += 1
        self.pending = [b"".join(_msg(k, self.seq, b, f) for k, b, f in datagram) for datagram in answer]
        return self.seq

    def _recv(self) -> bytes:
        return self.pending.pop(0)


ADDR = struct.pack("=BBBBI", 2, 24, 0, 0, 1)
INTR = netlink.NLM_F_DUMP_INTR


def test_interrupted_dump_is_read_again() -> None:
    interrupted = [[(20, ADDR + b"A", INTR)], [(netlink.NLMSG_DONE, b"\0" * 4, INTR)]]
    clean = [[(20, ADDR + b"B", 0), (20, ADDR + b"C", 0)], [(netlink.NLMSG_DONE, b"\0" * 4, 0)]]
    with CraftedKernel([interrupted, clean]) as nl:
        bodies = nl.request(netlink.RTM_GETADDR, ADDR, flags=netlink.NLM_F_DUMP)
        assert nl.requests == 2
    assert [b[-1:] for b in bodies] == [b"B", b"C"]


def test_interrupt_flag_on_done_only_still_retries() -> None:
    flagged_done = [[(20, ADDR + b"A", 0), (netlink.NLMSG_DONE, b"\0" * 4, INTR)]]
    clean = [[(20, ADDR + b"B", 0), (netlink.NLMSG_DONE, b"\0" * 4, 0)]]
    with CraftedKernel([flagged_done, clean]) as nl:
        assert [b[-1:] for b in nl.request(netlink.RTM_GETADDR, ADDR, flags=netlink.NLM_F_DUMP)] == [b"B"]


def test_dump_interrupted_every_time_is_a_bounded_error() -> None:
    always = [[(20, ADDR + b"A", INTR), (netlink.NLMSG_DONE, b"\0" * 4, INTR)]]
    with CraftedKernel([always]) as nl:
        with pytest.raises(OSError) as info:
            nl.request(netlink.RTM_GETADDR, ADDR, flags=netlink.NLM_F_DUMP)
        assert info.value.errno == errno.EINTR and nl.requests == netlink.RtNetlink.DUMP_RETRIES


def test_message_longer_than_its_datagram_is_an_error() -> None:
    with CraftedKernel([[[]]]) as nl:
        seq = nl._send(netlink.RTM_GETLINK, 0, b"")
        nl.pending = [HDR.pack(400, 16, 0, seq, 0) + b"\0" * 8]
        with pytest.raises(OSError) as info:
            list(nl._replies(seq, True))
        assert info.value.errno == errno.EMSGSIZE


class TinyBuffer(netlink.RtNetlink):
    BUFFER = 64  # far below one RTM_NEWLINK reply


@pytest.mark.netns
def test_reply_larger_than_the_buffer_grows_it(netns) -> None:
    netns.ip("link", "set", "lo", "up")
    with NetNS(netns.path), TinyBuffer() as nl:
        link = nl.get_link("lo")
        assert link is not None and link.name == "lo" and link.mtu == 65536
        assert len(nl._buf) > TinyBuffer.BUFFER
        addrs = nl.addresses(link.index)
    assert any(netlink.format_cidr(*a[:3]) == "127.0.0.1/8" for a in addrs)


class CappedBuffer(netlink.RtNetlink):
    BUFFER = 64
    MAX_BUFFER = 128


@pytest.mark.netns
def test_reply_beyond_the_cap_is_emsgsize_not_a_silent_cut(netns) -> None:
    with NetNS(netns.path), CappedBuffer() as nl:
        with pytest.raises(OSError) as info:
            nl.get_link("lo")
        assert info.value.errno == errno.EMSGSIZE
        nl.MAX_BUFFER = 1 << 20
        assert nl.get_link("lo").name == "lo", "the oversized reply was consumed; the socket stays usable"
