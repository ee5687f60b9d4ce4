"""The ceilings of a profile's sizes, shared by ``edge profile`` and :class:`ProfileSettings`.

A count or a length that sizes a profile run has an upper bound, so that a typo of a few
digits is refused by name at once instead of starting a run that never ends. The command
line (:mod:`edge_core.cli.profile_cmd`, refused by argparse, exit 2) and the Python API
(:class:`~edge_core.evidence.profiling.ProfileSettings`, a ``ValueError`` naming the
field) read the same numbers from here, and the sustained run's default window.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_WINDOW_S", "MAX_DURATION_S", "MAX_PROCESS_STARTS", "MAX_REQUESTS",
           "MAX_STARTUP_SAMPLES", "MAX_WINDOW_S"]

MAX_REQUESTS: Final = 100_000
"""The most measured, warm-up or matched requests (each per class or input group, and per
concurrency level for the first two)."""

MAX_PROCESS_STARTS: Final = 1_000
"""The most bare worker starts per route."""

MAX_STARTUP_SAMPLES: Final = 100
"""The most traced start-ups (each opens the pipeline twice more: the traced run and the
untraced one after it)."""

MAX_DURATION_S: Final = 7 * 24 * 3600.0
"""The longest sustained run, in seconds (a week)."""

MAX_WINDOW_S: Final = 24 * 3600.0
"""The longest window of a sustained run, in seconds (a day)."""

DEFAULT_WINDOW_S: Final = 60.0
"""A sustained run's window when none is given, in seconds (a run shorter than it is one
window)."""
