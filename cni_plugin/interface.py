"""Interface work inside CNI_NETNS: setup, read-back, verification, restore.

Imported only when an invocation really touches the netns (an `interface`
block, a result without mac/mtu or with IPv6 addresses, CHECK, DEL with saved
state), so a plain report-only IPv4 ADD never pays for netlink or setns.
"""

from __future__ import annotations

from .config import InterfaceConf, sysctl_path_parts
from .lean import posixos as os
from .lean.errors import INTERFACE_NOT_FOUND, INVALID_NETWORK_CONFIG, IO_FAILURE, UNKNOWN_CONTAINER, CNIError
from .lean.netlink import TENTATIVE, Link, RtNetlink, format_cidr, ipv6_address_events, parse_cidr, unusable
from .lean.netns import NetNS

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any


def sysctl_file(key: str, ifname: str) -> str:
    """`net.ipv4.conf.IFNAME.arp_filter` -> /proc/sys/net/ipv4/conf/<ifname>/arp_filter."""
    parts = [ifname if p == "IFNAME" else p for p in sysctl_path_parts(key)]
    return "/proc/sys/" + "/".join(parts)


def _read_sysctl(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode().strip()


def _write_sysctl(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _enter(netns: str) -> NetNS:
    return NetNS(netns)


class _Inside:
    """Run a block inside the sandbox netns, where entering can fail on its own.

    Failing to enter is the spec's "container unknown" (code 3), while an
    OSError inside the block is the caller's to judge, so the two are kept
    apart here rather than by one try around both.
    """

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.ns = _enter(netns)

    def __enter__(self) -> "_Inside":
        try:
            self.ns.__enter__()
        except OSError as exc:
            raise _open_error(self.netns, exc) from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.ns.__exit__(None, None, None)


def _open_error(netns: str, exc: OSError) -> CNIError:
    return CNIError(UNKNOWN_CONTAINER, f"cannot open netns {netns!r}: {exc.strerror or exc}")


def _find(nl: RtNetlink, ifname: str, netns: str) -> Link:
    link = nl.get_link(ifname)
    if link is None:
        raise CNIError(INTERFACE_NOT_FOUND, f"interface {ifname!r} not found in netns {netns!r}")
    return link


def read_back(netns: str, ifname: str) -> Link:
    """MAC and MTU of CNI_IFNAME as the kernel has them."""
    try:
        with _enter(netns), RtNetlink() as nl:
            return _find(nl, ifname, netns)
    except OSError as exc:
        raise _open_error(netns, exc) from None


def unusable_addresses(netns: str, ifname: str, cidrs: list[str], wait: float) -> dict[str, str]:
    """Which of the result's addresses `cidrs` CNI_IFNAME holds but cannot use: {cidr as the result
    writes it: "tentative" | "dadfailed" | "deprecated"} (netlink.unusable); {} when all are usable.

    An IPv6 address is tentative from when it is added until duplicate address detection ends (1 to
    2 s with the kernel's defaults, unless the primary plugin waited for it), and DAD-failed for good
    if another host on the link holds it. The publisher leaves such an address out of the entry and
    says why in Ready. While one is tentative and `wait` (addressWaitMs) is left, the kernel's
    address notifications are awaited, so a DAD that ends within it is the ADD's news; past it the
    publisher's live watch follows the address (docs/plugin.md "What the entry says about addresses").
    An address the interface does not hold is not judged here: the live watch reports it lost.
    """
    wanted = {}
    for cidr in cidrs:
        parsed = parse_cidr(cidr)
        if parsed is not None:
            wanted[parsed] = cidr
    if not wanted:
        return {}
    import time  # only a wait needs a clock

    deadline = time.monotonic() + wait
    with _Inside(netns), RtNetlink() as nl:
        link = _find(nl, ifname, netns)
        events = None
        try:
            while True:
                found = _judged(nl, link.index, wanted)
                left = deadline - time.monotonic()
                if TENTATIVE not in found.values() or left <= 0:
                    return found
                if events is None:  # subscribe, then read again: a DAD that ended meanwhile is not missed
                    events = ipv6_address_events()
                    continue
                events.settimeout(left)
                try:
                    events.recv(65536)  # its content does not matter: the next read takes the whole state
                except TimeoutError:
                    pass
                except OSError as exc:
                    if exc.errno != 105:  # ENOBUFS: notifications overflowed, a change all the same
                        raise
        finally:
            if events is not None:
                events.close()


def _judged(nl: RtNetlink, index: int, wanted: dict[tuple[int, bytes, int], str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for family, raw, prefixlen, flags in nl.addresses(index):
        cidr = wanted.get((family, raw, prefixlen))
        why = unusable(flags)
        if cidr is not None and why:
            found[cidr] = why
    return found


def _set_error(field: str, exc: OSError) -> CNIError:
    code = INVALID_NETWORK_CONFIG if exc.errno in (22, 34, 99) else IO_FAILURE  # EINVAL ERANGE EADDRNOTAVAIL
    return CNIError(code, f"interface setup failed: interface.{field}: {exc.strerror or exc}")


def apply(netns: str, ifname: str, conf: InterfaceConf, path: str, meta: dict[str, Any]) -> Link:
    """Apply the `interface` block; save the originals first so DEL can restore.

    On a failure half-way, what was already changed is rolled back and the
    state removed, so a failed ADD leaves the sandbox as it found it.
    """
    from . import state as state_store  # setup only: a read-back never saves state

    with _Inside(netns), RtNetlink() as nl:
        link = _find(nl, ifname, netns)
        original = _originals(link, conf, ifname)
        try:
            state_store.save(path, dict(meta, original=original, applied=conf.to_dict()))
        except OSError as exc:
            # Without saved originals DEL could not restore: change nothing.
            raise CNIError(IO_FAILURE, f"cannot save plugin state in stateDir: {exc.strerror or exc}") from None
        try:
            _apply(nl, link, conf, ifname)
        except OSError as exc:
            field = getattr(exc, "netclaim_field", "?")
            _restore(nl, ifname, original)
            state_store.remove(path)
            raise _set_error(field, exc) from None
        return _find(nl, ifname, netns)


def _originals(link: Link, conf: InterfaceConf, ifname: str) -> dict[str, Any]:
    original: dict[str, Any] = {}
    if conf.mtu is not None and conf.mtu != link.mtu:
        original["mtu"] = link.mtu
    if conf.tx_queue_len is not None and conf.tx_queue_len != link.txqlen:
        original["txQueueLen"] = link.txqlen
    if conf.mac is not None and conf.mac != link.mac:
        original["mac"] = link.mac
    if conf.alt_name is not None and conf.alt_name not in link.alt_names:
        original["altNameAdded"] = conf.alt_name
    if conf.up is not None and conf.up != link.up:
        original["up"] = link.up
    sysctl = {}
    for key in conf.sysctl:
        path = sysctl_file(key, ifname)
        try:
            sysctl[path] = _read_sysctl(path)
        except OSError as exc:
            raise CNIError(INVALID_NETWORK_CONFIG,
                           f"invalid network config: interface.sysctl[{key!r}]: {exc.strerror}") from None
    if sysctl:
        original["sysctl"] = sysctl
    return original


def _tag(exc: OSError, field: str) -> OSError:
    exc.netclaim_field = field  # type: ignore[attr-defined]
    return exc


def _apply(nl: RtNetlink, link: Link, conf: InterfaceConf, ifname: str) -> None:
    steps = (
        ("mtu", conf.mtu, lambda v: nl.set_link(link.index, mtu=v)),
        ("txQueueLen", conf.tx_queue_len, lambda v: nl.set_link(link.index, txqlen=v)),
        ("mac", conf.mac, lambda v: nl.set_mac(link, v)),
        ("altName", conf.alt_name if conf.alt_name not in link.alt_names else None,
         lambda v: nl.alt_name(link.index, v, add=True)),
        ("up", conf.up, lambda v: nl.set_link(link.index, up=v)),
    )
    for field, value, setter in steps:
        if value is None:
            continue
        try:
            setter(value)
        except OSError as exc:
            raise _tag(exc, field) from None
    for key, value in conf.sysctl.items():
        try:
            _write_sysctl(sysctl_file(key, ifname), value)
        except OSError as exc:
            raise _tag(exc, f"sysctl[{key!r}]") from None


SYSCTL_ROOT = "/proc/sys/net/"


def restorable_sysctl(path: object) -> str | None:
    """The path if DEL may write it: a string whose realpath is under /proc/sys/net.

    The state file is the plugin's own, but DEL runs as root on whatever it
    finds there, so a file naming any other path (planted, corrupt, or with
    `..`/symlinks) must never become a root write elsewhere.
    """
    if not isinstance(path, str) or "\x00" in path:
        return None
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return real if real.startswith(SYSCTL_ROOT) else None


def _restore(nl: RtNetlink, ifname: str, original: dict[str, Any]) -> list[str]:
    """Put back every recorded original; best effort, returns what failed or was refused."""
    failed: list[str] = []
    if not isinstance(original, dict):
        return ["state: 'original' is not an object"]
    link = nl.get_link(ifname)
    if link is None:
        return failed
    sysctl = original.get("sysctl", {})
    for path, value in (sysctl.items() if isinstance(sysctl, dict) else ()):
        target = restorable_sysctl(path)
        if target is None or not isinstance(value, str):
            failed.append(f"refused: {str(path)[:200]!r} is not a /proc/sys/net path with a string value")
            continue
        try:
            _write_sysctl(target, value)
        except OSError as exc:
            failed.append(f"{target}: {exc.strerror}")
    actions = (
        ("up", bool, lambda v: nl.set_link(link.index, up=v)),
        ("altNameAdded", str, lambda v: nl.alt_name(link.index, v, add=False)),
        ("mac", str, lambda v: nl.set_mac(link, v)),
        ("txQueueLen", int, lambda v: nl.set_link(link.index, txqlen=v)),
        ("mtu", int, lambda v: nl.set_link(link.index, mtu=v)),
    )
    for key, kind, action in actions:
        if key not in original:
            continue
        try:
            action(_typed(original[key], kind, key))
        except OSError as exc:
            if not (key == "altNameAdded" and exc.errno in (2, 19, 61)):
                failed.append(f"{key}: {exc.strerror}")
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            failed.append(f"{key}: refused: {exc}"[:300])
    return failed


def _typed(value: object, kind: type, key: str) -> Any:
    if type(value) is not kind:
        raise ValueError(f"state value of {key} is not a {kind.__name__}")
    return value


def restore(netns: str, ifname: str, saved: dict[str, Any]) -> list[str]:
    """DEL: restore originals inside the netns; a vanished netns or link is fine."""
    try:
        ns = _enter(netns)
        ns.__enter__()
    except OSError:
        return []
    try:
        with RtNetlink() as nl:
            return _restore(nl, ifname, saved.get("original", {}))
    finally:
        ns.__exit__(None, None, None)


def verify(netns: str, ifname: str, expected_mac: str | None, addresses: list[str],
           conf: InterfaceConf | None) -> list[str]:
    """CHECK: every difference between the netns and prevResult/config, as text."""
    problems: list[str] = []
    with _Inside(netns), RtNetlink() as nl:
        link = nl.get_link(ifname)
        if link is None:
            return [f"interface {ifname} is missing"]
        if expected_mac and expected_mac.lower() != link.mac:
            problems.append(f"mac is {link.mac}, prevResult says {expected_mac.lower()}")
        present = {(f, raw, plen) for f, raw, plen, _flags in nl.addresses(link.index)}
        for cidr in addresses:
            parsed = parse_cidr(cidr)
            if parsed is None or parsed not in present:
                problems.append(f"address {cidr} is missing")
        if conf is not None:
            problems += _verify_conf(link, conf, ifname)
        if problems:
            have = sorted(format_cidr(*p) for p in present)
            problems.append(f"(interface has {', '.join(have) or 'no addresses'})")
    return problems


def _verify_conf(link: Link, conf: InterfaceConf, ifname: str) -> list[str]:
    problems = []
    checks = (("mtu", conf.mtu, link.mtu), ("txQueueLen", conf.tx_queue_len, link.txqlen),
              ("mac", conf.mac, link.mac), ("up", conf.up, link.up))
    for field, want, have in checks:
        if want is not None and want != have:
            problems.append(f"{field} is {have!r}, config says {want!r}")
    if conf.alt_name is not None and conf.alt_name not in link.alt_names:
        problems.append(f"altName {conf.alt_name} is missing")
    for key, want in conf.sysctl.items():
        path = sysctl_file(key, ifname)
        try:
            have = _read_sysctl(path)
        except OSError as exc:
            problems.append(f"sysctl {key}: {exc.strerror}")
            continue
        if have != want.strip():
            problems.append(f"sysctl {key} is {have!r}, config says {want!r}")
    return problems
