"""Click options kept as a list per room, applied as one decorator.

Each room's options.py keeps its options as a list in --help order so that `run` can take them
all and the room can build its own settings from them; click applies decorators bottom-up, so
the list is applied reversed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Decorator = Callable[[Any], Any]


def stacked(decorators: Sequence[Decorator]) -> Decorator:
    """One decorator applying `decorators` so that --help shows them in the list's order."""
    def apply(command: Any) -> Any:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command
    return apply
