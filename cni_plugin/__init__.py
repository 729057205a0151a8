"""netclaim's CNI plugin package; `wire/` and `lean/` are the contract both programs share.

`__version__` is re-exported from `wire/version.py`, the one place the version is written.
"""

from .wire.version import __version__

__all__ = ["__version__"]
