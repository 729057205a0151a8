"""Entry point: parse -> set up -> hand off -> print, with one error exit.

Whatever happens, stdout carries exactly one JSON document (the result, the
VERSION answer, or a CNI error) or nothing (successful DEL/CHECK/GC/STATUS),
and the exit code is 0 or 1. A Python traceback never reaches stdout: an
unexpected exception becomes error 199 and its traceback goes to the log.
"""

from __future__ import annotations

import os
import sys

from .config import (
    LATEST_VERSION,
    SUPPORTED_VERSIONS,
    cni_version_of,
    decode_stdin,
    parse_env,
    parse_netconf,
    version_at_least,
)
from .errors import INCOMPATIBLE_VERSION, INTERNAL_ERROR, IO_FAILURE, CNIError
from .jsonio import dumps
from .log import Log

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import IO, Any, Mapping

_MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


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
        data = stdin.read()
    except OSError as exc:
        raise CNIError(IO_FAILURE, f"cannot read stdin: {exc}") from None
    if env.command == "VERSION":
        from .commands import cmd_version

        return cmd_version()
    raw = decode_stdin(data)
    reply.version = _reply_version(raw)
    version = cni_version_of(raw)
    minimum = _MIN_VERSION.get(env.command)
    if minimum and not version_at_least(version, minimum):
        raise CNIError(INCOMPATIBLE_VERSION, f"config version {version} does not allow {env.command}",
                       f"{env.command} needs cniVersion >= {minimum}")
    conf = parse_netconf(raw, version, env.command)
    log.configure(conf.log_file)
    pod = env.pod
    log.bind(command=env.command, containerID=env.container_id, ifname=env.ifname, network=conf.name,
             pod=f"{pod[0]}/{pod[1]}" if pod else None, podUID=pod[2] if pod else None)
    from .commands import COMMANDS

    return COMMANDS[env.command](env, conf, log)


def main(environ: Mapping[str, str] | None = None, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | None = None) -> int:
    """Run one CNI invocation; returns the exit code (console script: sys.exit(main()))."""
    environ = os.environ if environ is None else environ
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout.buffer if stdout is None else stdout
    log = Log()
    reply = _Reply()
    try:
        document = run(environ, stdin, log, reply)
        if document is not None:
            _emit(stdout, document)
        return 0
    except CNIError as exc:
        error = exc
        log.error("command failed", code=error.code, msg=error.msg, details=error.details)
    except Exception as exc:  # noqa: BLE001 - the protocol needs JSON for every failure
        import traceback

        error = CNIError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}", str(exc)[:512])
        log.error("internal error", error=repr(exc), traceback=traceback.format_exc())
    finally:
        log.close()
    try:
        _emit(stdout, error.to_dict(reply.version))
    except OSError:
        pass
    return 1
