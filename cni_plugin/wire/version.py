"""The one version of the netclaim distribution.

setup.cfg reads it with `attr:`; the plugin's VERSION answer, the publisher, the chart and the
image take it from here. A plain constant: the plugin may import it on a pod start.
"""

__version__ = "0.2.0"
