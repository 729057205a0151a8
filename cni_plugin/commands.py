"""One function per CNI verb: cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status, cmd_version.

Each takes the validated environment and config, does its netns work (only
when needed), hands an event to the publisher and returns the JSON to print
(or None: DEL, CHECK, GC and STATUS print nothing on success).
"""

from __future__ import annotations

from . import handoff
from .config import LATEST_VERSION, SUPPORTED_VERSIONS, Env, NetConf
from .lean.errors import CHECK_DRIFT, NOT_AVAILABLE, CNIError, config_error
from .wire import results
from .wire.event import Event, PodRef
from .wire.spool import spool_problem

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType
    from typing import Any

    from .log import Log

GC_ATTACHMENT = "*"  # container_id/ifname of a GC event: it covers the whole network


def _event(op: str, env: Env, conf: NetConf, **fields: Any) -> Event:
    pod = env.pod
    return Event(
        op=op,
        container_id=env.container_id or GC_ATTACHMENT,
        ifname=env.ifname or GC_ATTACHMENT,
        driver=conf.driver,
        netns=env.netns,
        network=conf.name,
        request=conf.request,
        extended_resource=conf.extended_resource,
        device_id=conf.device_id,
        pod=PodRef(*pod) if pod else None,
        cni_version=conf.cni_version,
        **fields,
    )


def _state_store() -> ModuleType:
    """cni_plugin.state, imported when a verb needs saved state (setup, DEL, GC): a report-only ADD never does."""
    from . import state

    return state


def _state_path(env: Env, conf: NetConf) -> str:
    return _state_store().state_path(conf.state_dir, conf.name, env.container_id, env.ifname)


def _fill_from_link(result: dict[str, Any], index: int | None, link: Any, env: Env) -> None:
    """Put the kernel's MAC/MTU into the sandbox interface entry (add one if missing)."""
    if index is None:
        result["interfaces"].append({"name": env.ifname, "mac": link.mac, "mtu": link.mtu, "sandbox": env.netns})
        return
    iface = result["interfaces"][index]
    iface["mac"] = link.mac
    iface["mtu"] = link.mtu


def _needs_read_back(result: dict[str, Any], index: int | None, version: str) -> bool:
    if index is None:
        return True
    iface = result["interfaces"][index]
    return not iface.get("mac") or (version.startswith("1.") and not iface.get("mtu"))


def cmd_add(env: Env, conf: NetConf, log: Log) -> dict[str, Any]:
    prev = conf.prev_result or {}
    results.validate(prev)
    current = results.to_current(prev)
    index = results.sandbox_interface(current, env.ifname)
    if conf.interface is not None:
        from . import interface

        meta = {"network": conf.name, "containerID": env.container_id, "ifname": env.ifname, "netns": env.netns}
        link = interface.apply(env.netns, env.ifname, conf.interface, _state_path(env, conf), meta)
        _fill_from_link(current, index, link, env)
        log.info("interface configured", applied=conf.interface.to_dict())
    elif _needs_read_back(current, index, conf.cni_version):
        from . import interface

        try:
            _fill_from_link(current, index, interface.read_back(env.netns, env.ifname), env)
        except CNIError as exc:
            # Report-only: a missing MAC/MTU must not fail the pod; report what we have.
            log.warning("interface read-back failed", error=exc.msg)
    _check_device_id(conf, current, index, log)
    unusable = _unusable_addresses(env, conf, current, index, log)
    outcome = handoff.deliver(_event("ADD", env, conf, result=current, unusable_ips=unusable or None), conf, log,
                              may_fail=True)
    log.info("ADD done", handoff=outcome, **({"unusableAddresses": unusable} if unusable else {}))
    return results.from_current(current, conf.cni_version)


def _unusable_addresses(env: Env, conf: NetConf, current: dict[str, Any], index: int | None,
                        log: Log) -> dict[str, str]:
    """The result's IPv6 addresses of CNI_IFNAME that the interface cannot use yet (DAD) or at all.

    The entry lists only usable addresses: consumers send traffic to them. Reading them takes one
    entry into the netns and one address dump (~2 ms), paid only by a result with IPv6 addresses:
    IPv4 has no DAD, so an IPv4-only ADD stays netns-free (a deprecated IPv4 address, which only
    an operator makes, is the live watch's to see). A failed read changes nothing about the ADD
    (the entry then lists the result's addresses, and the live watch judges them).
    """
    cidrs = [c for c in results.addresses_for(current, index) if ":" in c]
    if not cidrs or not env.netns:
        return {}
    from . import interface

    try:
        return interface.unusable_addresses(env.netns, env.ifname, cidrs, conf.address_wait)
    except (CNIError, OSError) as exc:
        log.warning("address state read failed", error=getattr(exc, "msg", None) or str(exc))
        return {}


def _check_device_id(conf: NetConf, current: dict[str, Any], index: int | None, log: Log) -> None:
    """Believe the result's `pciID` of the sandbox interface over the ID the meta plugin asked for.

    The result says which device the interface is really on; the requested ID says which one it
    was meant to be. They differ only when a delegate took another device, and the entry must
    describe the interface as it is: the publisher maps by the result's, and the log says so.
    """
    if index is None:
        return
    pci = current["interfaces"][index].get("pciID")
    if not isinstance(pci, str) or not pci:
        return
    from .wire.deviceid import normalize, problem

    if problem(pci):
        log.warning("the result's pciID is not used", why=problem(pci))
        return
    found = normalize(pci)
    if conf.device_id and conf.device_id != found:
        log.warning("the interface is on another device than the one the meta plugin named",
                    requested=conf.device_id, pciID=found)
    conf.device_id = found


def cmd_del(env: Env, conf: NetConf, log: Log) -> None:
    """Best effort and idempotent: no netns, no state, no prevResult, no publisher are all fine.

    Each step runs on its own, so a failure in one (a corrupt state file, a
    restore the kernel refuses, a full spool) still lets the others record
    what they can; main() turns anything left into a log line and exit 0.
    """
    restored = False
    if conf.name and conf.state_dir:
        restored = _best_effort(log, "state restore", lambda: _restore_state(env, conf, log))
    else:
        log.warning("no valid network name or stateDir: plugin state not looked up")
    current = None
    if conf.prev_result is not None:
        try:
            results.validate(conf.prev_result)
            current = results.to_current(conf.prev_result)
        except Exception as exc:  # noqa: BLE001 - DEL reports without it rather than fail
            log.warning("ignoring invalid prevResult on DEL", error=getattr(exc, "msg", repr(exc)))
    if not conf.driver:
        log.error("DEL event not handed off: no valid driverName")
        return None
    outcome = _best_effort(log, "hand-off", lambda: handoff.deliver(_event("DEL", env, conf, result=current), conf,
                                                                     log, may_fail=False))
    log.info("DEL done", handoff=outcome, restored=restored)
    return None


def _best_effort(log: Log, step: str, action: Any) -> Any:
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - DEL records what it can and goes on
        log.error(f"DEL: {step} failed", error=f"{type(exc).__name__}: {exc}"[:512])
        return None


def _restore_state(env: Env, conf: NetConf, log: Log) -> bool:
    state_store = _state_store()
    path = _state_path(env, conf)
    saved = state_store.load(path)
    if saved is not None and env.netns:
        from . import interface

        try:
            failed = interface.restore(env.netns, env.ifname, saved)
        except OSError as exc:
            failed = [str(exc)]
        if failed:
            log.warning("restore incomplete", failed=failed)
    state_store.remove(path)
    return saved is not None


def cmd_check(env: Env, conf: NetConf, log: Log) -> None:
    from . import interface

    prev = conf.prev_result or {}
    results.validate(prev)
    current = results.to_current(prev)
    index = results.sandbox_interface(current, env.ifname)
    mac = current["interfaces"][index].get("mac") if index is not None else None
    problems = interface.verify(env.netns, env.ifname, mac, results.addresses_for(current, index), conf.interface)
    check_error = "; ".join(problems)
    outcome = handoff.deliver(_event("CHECK", env, conf, result=current, check_error=check_error), conf, log,
                              may_fail=False)
    log.info("CHECK done", handoff=outcome, drift=check_error)
    if problems:
        raise CNIError(CHECK_DRIFT, f"CHECK: interface {env.ifname} differs from prevResult/config", check_error)
    return None


def _valid_attachments(raw: dict[str, Any]) -> list[dict[str, str]]:
    """The runtime's still-valid attachments; none given means none are valid.

    libcni (the library containerd and CRI-O use) sends `null` for an empty
    list (a Go nil slice: the node has no sandbox left) and omits both keys
    when called without GC arguments (its own cnitool does that to collect
    everything, after DELing every cached attachment of the network). Both
    mean the empty set; only a value of the wrong shape is a config error.
    """
    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
        if key in raw:
            value = raw[key]
            if value is None:
                return []
            if not isinstance(value, list) or not all(
                isinstance(a, dict) and isinstance(a.get("containerID"), str) and isinstance(a.get("ifname"), str)
                for a in value
            ):
                raise config_error(key, "must be a list of {containerID, ifname}")
            return [{"containerID": a["containerID"], "ifname": a["ifname"]} for a in value]
    return []


def cmd_gc(env: Env, conf: NetConf, log: Log) -> None:
    valid = _valid_attachments(conf.raw)
    keep = {(a["containerID"], a["ifname"]) for a in valid}
    removed = []
    state_store = _state_store()
    for container_id, ifname, path in state_store.list_attachments(conf.state_dir, conf.name):
        if (container_id, ifname) not in keep:
            state_store.remove(path)
            removed.append(f"{container_id}/{ifname}")
    outcome = handoff.deliver(_event("GC", env, conf, valid_attachments=valid), conf, log, may_fail=False)
    log.info("GC done", handoff=outcome, removedState=removed, valid=len(valid))
    return None


def cmd_status(env: Env, conf: NetConf, log: Log) -> None:
    """Under failurePolicy Fail: not ready (50) when an ADD would fail now, i.e.
    root's publisher does not accept a connection on the socket and the spool
    cannot take an event. The spool is checked the way ADD uses it, short of
    writing an event (spool.spool_problem: open/create the dir safely, caps,
    free space and inodes, a probe file). Under Ignore an ADD never fails on
    the hand-off, so STATUS is always ready."""
    if conf.failure_policy != "Fail":
        return None
    if handoff.socket_accepts(conf.socket_path, conf.ack_timeout):
        return None
    problem = spool_problem(conf.spool_dir, conf.spool_max_files, conf.spool_max_bytes)
    if not problem:
        return None
    log.error("STATUS: not ready", socketPath=conf.socket_path, spoolDir=conf.spool_dir, spoolError=problem)
    raise CNIError(NOT_AVAILABLE, "netclaim is not ready: the publisher socket refuses connections and the spool "
                   "cannot take an event", f"socketPath={conf.socket_path} spoolDir={conf.spool_dir}: {problem}")


def cmd_version() -> dict[str, Any]:
    return {"cniVersion": LATEST_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}


COMMANDS = {"ADD": cmd_add, "DEL": cmd_del, "CHECK": cmd_check, "GC": cmd_gc, "STATUS": cmd_status}
