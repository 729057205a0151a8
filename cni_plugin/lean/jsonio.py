"""JSON for the plugin's hot path without importing the `json` package.

`import json` pulls in `re`, `enum` and `functools` and costs as much as the
whole interpreter start-up on these machines (measured: ~10 ms on a ~10 ms
floor). The C accelerator `_json` that `json` itself uses is cheap to load, so
the plugin drives it directly. Semantics match `json.loads`/`json.dumps` with
`ensure_ascii=True`, except that NaN/Infinity, and numbers that overflow a
float to infinity (`1e999`), are rejected: CNI configs come from Go, which
never produces them and refuses to decode them.

`_json` is an interpreter internal, not a public API, and it is not total: on
some malformed documents (an unterminated string, a missing ':') it reports
the error through `json.decoder`, which the plugin never imports, and fails
with SystemError instead. So `loads` trusts the fast scanner only when it
succeeds; on any failure it re-parses with the standard `json` module, on the
error path only, and reports what that says. The hot path stays import-free.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

try:
    import _json
except ImportError:  # pragma: no cover - CPython always ships it
    _json = None  # type: ignore[assignment]  # the module or None: every use below tests for None first

_WS = " \t\n\r"

# How deep a document the plugin and the publisher accept (objects and arrays
# nested). A CNI config with its prevResult is under 10 levels; the limit
# keeps every later step (conversion, re-encoding, the publisher's mapping)
# far from the interpreter's recursion limit, which a 700-level document hits.
MAX_JSON_DEPTH = 64


class JSONError(ValueError):
    """Input that is not one JSON document."""


def _reject_constant(name: str) -> None:
    raise JSONError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf (nan cannot come from a number literal)
        raise JSONError(f"number {text[:32]} is out of range")
    return value


def _unserializable(obj: object) -> None:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


class _ScanContext:
    """The attributes `_json.make_scanner` reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = staticmethod(_finite_float)
    parse_int = int
    parse_constant = staticmethod(_reject_constant)
    memo: dict = {}


if _json is not None:
    # typeshed types the context as a JSONDecoder; the C scanner reads only the attributes _ScanContext has.
    _scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
    _encode = _json.make_encoder(
        None, _unserializable, _json.encode_basestring_ascii, None, ":", ",", False, False, False
    )


def loads(text: str) -> object:
    """Parse exactly one JSON value from `text`; JSONError for anything else."""
    if _json is not None:
        start = len(text) - len(text.lstrip(_WS))
        try:
            value, end = _scan(text, start)
        except Exception:  # noqa: BLE001 - any scanner failure: let json say why
            pass
        else:
            if not text[end:].strip(_WS):
                return value
            raise JSONError(f"extra data after the JSON value at char {end}")
    return _slow_loads(text)


def _slow_loads(text: str) -> object:
    """The error path (and the no-`_json` fallback): the standard decoder, same rules."""
    import json

    try:
        return json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)
    except RecursionError:
        raise JSONError("JSON nested too deeply") from None
    except JSONError:
        raise
    except ValueError as exc:  # JSONDecodeError, int digit limit
        raise JSONError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the decoder must be total
        raise JSONError(f"undecodable JSON: {type(exc).__name__}") from None


def too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Is `value` (decoded JSON) nested more than `limit` objects/arrays deep? Iterative: no recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def dumps(value: object) -> str:
    """Compact ASCII JSON (safe for any str, including lone surrogates)."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    return "".join(_encode(value, 0))
