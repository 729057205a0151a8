"""JSON for the plugin's hot path without importing the `json` package.

`import json` pulls in `re`, `enum` and `functools` and costs as much as the
whole interpreter start-up on these machines (measured: ~10 ms on a ~10 ms
floor). The C accelerator `_json` that `json` itself uses is cheap to load, so
the plugin drives it directly. Semantics match `json.loads`/`json.dumps` with
`ensure_ascii=True`, except that NaN/Infinity are rejected (CNI configs come
from Go, which never produces them).
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # pragma: no cover - CPython always ships it
    _json = None

_WS = " \t\n\r"


class JSONError(ValueError):
    """Input that is not one JSON document."""


def _reject_constant(name: str) -> None:
    raise JSONError(f"non-standard JSON constant {name}")


def _unserializable(obj: object) -> None:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


class _ScanContext:
    """The attributes `_json.make_scanner` reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_reject_constant)
    memo: dict = {}


if _json is not None:
    _scan = _json.make_scanner(_ScanContext())
    _encode = _json.make_encoder(
        None, _unserializable, _json.encode_basestring_ascii, None, ":", ",", False, False, False
    )


def loads(text: str) -> object:
    """Parse exactly one JSON value from `text`."""
    if _json is None:  # pragma: no cover
        import json

        try:
            return json.loads(text)
        except ValueError as exc:
            raise JSONError(str(exc)) from None
    start = len(text) - len(text.lstrip(_WS))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:
        raise JSONError(f"expecting a JSON value at char {stop.value}") from None
    except RecursionError:
        raise JSONError("JSON nested too deeply") from None
    except JSONError:
        raise
    except ValueError as exc:  # json.decoder.JSONDecodeError, raised by _json
        raise JSONError(str(exc)) from None
    if text[end:].strip(_WS):
        raise JSONError(f"extra data after the JSON value at char {end}")
    return value


def dumps(value: object) -> str:
    """Compact ASCII JSON (safe for any str, including lone surrogates)."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    return "".join(_encode(value, 0))
