"""Entry point: parse -> set up -> hand off -> print, with one error exit.

Whatever happens, stdout carries exactly one JSON document (the result, the
VERSION answer, or a CNI error) or nothing (successful DEL/CHECK/GC/STATUS),
and the exit code is 0 or 1. A Python traceback never reaches stdout: an
unexpected exception becomes error 199 and its traceback goes to the log.
DEL and STATUS follow the node-safety policy (docs/plugin.md): DEL exits 0
on every problem of netclaim's own, STATUS fails only under failurePolicy
Fail. `netclaim --help` / `--version` (or a terminal without CNI_COMMAND)
print the usage and version instead of speaking CNI.
"""

from __future__ import annotations

import sys

from .config import (
    LATEST_VERSION,
    MAX_STDIN_BYTES,
    RETIRED_MARKER,
    SUPPORTED_VERSIONS,
    cni_version_of,
    decode_stdin,
    parse_env,
    parse_netconf,
    tolerant_netconf,
    version_at_least,
)
from .lean import posixos as os
from .lean.errors import INCOMPATIBLE_VERSION, INTERNAL_ERROR, IO_FAILURE, CNIError
from .lean.jsonio import dumps
from .log import Log

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import IO, Any, Mapping

    from .config import Env, NetConf

_MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def _retired() -> str:
    """The executable's path when netclaim is uninstalled from this node and it only stays for old
    sandboxes, else ''.

    Then DEL and GC do nothing for netclaim and exit 0: nobody would ever read a
    spooled event, and an uninstalled node must not grow files (publisher/keeper/keeper.py
    remove_plugin). One readlink and one lstat; the marker sits beside the
    executable the runtime runs (a source-tree launcher's is the interpreter's
    directory, where no marker ever is).
    """
    try:
        exe = os.readlink("/proc/self/exe")
    except OSError:
        return ""
    return exe if os.path.lexists(os.path.join(os.path.dirname(exe), RETIRED_MARKER)) else ""


def _retire(exe: str, env: Env) -> None:
    """The last DEL of a retired executable removes it and its marker (cni_plugin/retire.py).

    Best effort and silent: whatever happens, the DEL exits 0 and prints nothing.
    """
    try:
        from .retire import finish

        finish(exe, env.container_id or "", env.ifname or "")
    except Exception:  # noqa: BLE001 - a retired DEL never fails the runtime's teardown
        pass


def _emit(out: IO[bytes], document: dict[str, Any]) -> None:
    out.write(dumps(document).encode() + b"\n")
    out.flush()


def _reply_version(raw: dict[str, Any]) -> str:
    version = raw.get("cniVersion")
    return version if version in SUPPORTED_VERSIONS else LATEST_VERSION


class _Reply:
    """The cniVersion an error reply carries: the config's, once it is known."""

    version = LATEST_VERSION


def run(environ: Mapping[str, str], stdin: IO[bytes], log: Log, reply: _Reply) -> dict[str, Any] | None:
    """Do the command; returns the document to print, or None."""
    env = parse_env(environ)
    try:
        data = stdin.read(MAX_STDIN_BYTES + 1)  # bounded: decode_stdin refuses more than the cap
    except OSError as exc:
        raise CNIError(IO_FAILURE, f"cannot read stdin: {exc}") from None
    if env.command == "VERSION":
        from .commands import cmd_version

        return cmd_version()
    if env.command in ("DEL", "GC"):
        exe = _retired()
        if exe:
            _retire(exe, env)
            return None
    raw = decode_stdin(data, env.command)
    reply.version = _reply_version(raw)
    if env.command == "DEL":
        _run_del(env, raw, log)
        return None
    if env.command == "STATUS":
        _run_status(env, raw, log)
        return None
    conf = _netconf(env, raw, log)
    from .commands import COMMANDS

    return COMMANDS[env.command](env, conf, log)


def _netconf(env: Env, raw: dict[str, Any], log: Log) -> NetConf:
    """The validated config (errors 1/7), with the log pointed at its logFile."""
    version = cni_version_of(raw)
    _check_verb_version(env.command, version)
    conf = parse_netconf(raw, version, env.command)
    _bind_log(log, env, conf)
    return conf


def _check_verb_version(command: str, version: str) -> None:
    """A verb the config's cniVersion predates is the caller's protocol error (1)."""
    minimum = _MIN_VERSION.get(command)
    if minimum and not version_at_least(version, minimum):
        raise CNIError(INCOMPATIBLE_VERSION, f"config version {version} does not allow {command}",
                       f"{command} needs cniVersion >= {minimum}")


def _bind_log(log: Log, env: Env, conf: NetConf) -> None:
    log.configure(conf.log_file)
    pod = env.pod
    log.bind(command=env.command, containerID=env.container_id, ifname=env.ifname, network=conf.name or None,
             pod=f"{pod[0]}/{pod[1]}" if pod else None, podUID=pod[2] if pod else None)


def _run_del(env: Env, raw: dict[str, Any], log: Log) -> None:
    """DEL never fails on netclaim's own problems (policy table in docs/plugin.md).

    The runtime runs DEL in reverse chain order and stops at the first failure,
    so an error here would keep bridge/IPAM from releasing the pod, forever.
    A broken netclaim entry (bad field, unknown cniVersion) is cleaned up with
    what can be read from it; any failure inside is logged; the exit is 0.
    """
    from .commands import cmd_del

    try:
        conf = _netconf(env, raw, log)
    except CNIError as exc:
        conf, problems = tolerant_netconf(raw)
        _bind_log(log, env, conf)
        log.error("DEL with an invalid config: cleaning up what it can, exiting 0", code=exc.code, error=exc.msg,
                  problems=problems)
    try:
        cmd_del(env, conf, log)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        _log_internal(log, "DEL failed; exiting 0 so the chain can still release the pod", exc)
    return None


def _run_status(env: Env, raw: dict[str, Any], log: Log) -> None:
    """STATUS fails only under failurePolicy Fail, and only when an ADD would fail now.

    A failing STATUS marks the node's network not ready (containerd), which
    taints the node and evicts running pods: under Ignore netclaim must never
    cause that, not even with a broken config of its own. A config version
    that predates STATUS is the caller's protocol error and stays error 1.
    """
    if raw.get("cniVersion") in SUPPORTED_VERSIONS:
        _check_verb_version(env.command, raw["cniVersion"])
    try:
        conf = _netconf(env, raw, log)
    except CNIError as exc:
        if raw.get("failurePolicy") == "Fail":
            raise
        log.error("STATUS: invalid config; ready anyway under failurePolicy Ignore", code=exc.code, error=exc.msg)
        return None
    from .commands import cmd_status

    return cmd_status(env, conf, log)


def _log_internal(log: Log, event: str, exc: BaseException) -> None:
    import traceback

    log.error(event, error=repr(exc)[:512], traceback=traceback.format_exc())


USAGE = """\
netclaim {version}: chained CNI plugin that reports a pod's network attachment
to netclaim-publisher (ResourceClaim.status.devices).

It is run by a container runtime (containerd, CRI-O) as the last plugin of a
conflist, with CNI_COMMAND and the other CNI_* variables in its environment and
the network config on stdin; see docs/plugin.md.

usage: netclaim [--help | --version]
CNI protocol versions supported: {versions}
"""


_MANUAL_FLAGS = ("--help", "-h", "--version")


def _by_hand(environ: Mapping[str, str], stdin: IO[bytes], argv: list[str]) -> bool:
    """--help/--version, or no CNI_COMMAND with a terminal on stdin (a runtime never gives one).

    Other arguments are ignored rather than refused: a runtime passes none,
    and a wrapper (a bundle's launcher) may pass its own.
    """
    if argv and argv[0] in _MANUAL_FLAGS:
        return True
    if environ.get("CNI_COMMAND"):
        return False
    try:
        return stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _manual(argv: list[str], stdout: IO[bytes], stderr: IO[bytes]) -> int:
    """`netclaim --help`, `--version`, or run by hand: say what this is (like libcni's skel)."""
    from .wire.version import __version__

    if argv[:1] == ["--version"]:
        versions = ", ".join(SUPPORTED_VERSIONS)
        stdout.write(f"netclaim {__version__}\nCNI protocol versions supported: {versions}\n".encode())
        stdout.flush()
        return 0
    text = USAGE.format(version=__version__, versions=", ".join(SUPPORTED_VERSIONS)).encode()
    if argv[:1] in (["--help"], ["-h"]):
        stdout.write(text)
        stdout.flush()
        return 0
    stderr.write(text)  # run by hand on a terminal: like libcni's skel, say what this is, exit 0
    stderr.flush()
    return 0


def main(environ: Mapping[str, str] | None = None, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | None = None, argv: list[str] | None = None) -> int:
    """Run one CNI invocation; returns the exit code (console script: sys.exit(main())).

    Tests drive it in-process with their own environ/stdin/stdout; then argv
    defaults to none (pytest's own arguments are not the plugin's).
    """
    if argv is None:
        argv = sys.argv[1:] if environ is None else []
    environ = os.getenviron() if environ is None else environ
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout.buffer if stdout is None else stdout
    if _by_hand(environ, stdin, argv):
        return _manual(argv, stdout, sys.stderr.buffer)
    log = Log()
    reply = _Reply()
    try:
        document = run(environ, stdin, log, reply)
        if document is not None:
            _emit(stdout, document)
        return 0
    except CNIError as exc:
        error = exc
        log.error("command failed", code=error.code, error=error.msg, details=error.details)
    except Exception as exc:  # noqa: BLE001 - the protocol needs JSON for every failure
        error = CNIError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}", str(exc)[:512])
        _log_internal(log, "internal error", exc)
    finally:
        log.close()
    try:
        _emit(stdout, error.to_dict(reply.version))
    except OSError:
        pass
    return 1
