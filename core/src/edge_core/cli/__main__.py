"""``python -m edge_core.cli``: the ``edge`` command line."""

import sys

from edge_core.cli import main

sys.exit(main())
