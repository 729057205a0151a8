"""CNI error codes and the one exception type the plugin raises on purpose.

The runtime (libcni) reads a failed plugin's stdout as `{cniVersion, code, msg,
details}`; the code tells it whether retrying can help, so every failure path
picks a code from the spec (SPEC.md "Error" section) or from the plugin range
(100+) documented in docs/plugin.md.
"""

from __future__ import annotations

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENVIRONMENT = 4
IO_FAILURE = 5
DECODING_FAILURE = 6
INVALID_NETWORK_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
NOT_AVAILABLE_EXISTING_AFFECTED = 51

# Plugin-specific codes (the spec leaves 100+ to plugins).
CHECK_DRIFT = 100  # CHECK found the sandbox interface differs from prevResult/config
INTERFACE_NOT_FOUND = 101  # CNI_IFNAME is not in CNI_NETNS
INTERNAL_ERROR = 199  # a bug: an exception nobody anticipated

SPEC_CODES = frozenset({1, 2, 3, 4, 5, 6, 7, 11, 50, 51})
PLUGIN_CODES = frozenset({CHECK_DRIFT, INTERFACE_NOT_FOUND, INTERNAL_ERROR})


class CNIError(Exception):
    """A failure that becomes the CNI error JSON on stdout (exit code 1)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict:
        return {"cniVersion": cni_version, "code": self.code, "msg": self.msg, "details": self.details}


def config_error(field: str, problem: str) -> CNIError:
    """Error 7 that names the offending field, so an operator can fix the conflist."""
    return CNIError(INVALID_NETWORK_CONFIG, f"invalid network config: {field}: {problem}")
