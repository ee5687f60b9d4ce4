"""``python -m edge_core.cli``: the ``edge`` command line, started as the ``edge`` script is.

Through :func:`edge_core.entry.main`: Ctrl-C and SIGTERM are handled before the command
line is imported (exit 130 or 143 and one line, never a traceback). Before, this module
imported the command line first, and a signal during those imports was Python's: a
``KeyboardInterrupt`` traceback, or an end by SIGTERM with no line and no JSON document.
"""

import sys

from edge_core.entry import main

sys.exit(main())
