"""netclaim's CNI plugin package.

`__version__` is the one version of the netclaim distribution (setup.cfg reads
it with `attr:`; the publisher, the chart and the image take it from here), so
it is a plain constant: this module runs on every pod start.
"""

__version__ = "0.2.0"
