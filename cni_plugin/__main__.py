"""`python -m cni_plugin`: the same entry point as the `netclaim` executable."""

import sys

from cni_plugin.main import main

sys.exit(main())
