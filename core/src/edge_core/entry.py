"""The ``edge`` console script's target: Ctrl-C and SIGTERM are handled before any import.

The script an installer writes for ``edge`` imports this module and calls :func:`main`;
so does ``python -m edge_core.cli`` (:mod:`edge_core.cli.__main__`).
Until the command line's own handling is in place, a Ctrl-C or SIGTERM gets Python's: a
``KeyboardInterrupt`` traceback from whichever module is being imported (the command line
imports dozens), or an end by the signal. :func:`main` first makes either end the process
at once, with exit code 130 or 143 and the one line ``edge: interrupted`` or ``edge:
terminated (SIGTERM)`` (and, with ``--json``, the document ``{"ok": false, "error":
...}`` on stdout), as the command line would: nothing has started yet that needs retiring
or removing. Only then does it import the command line
(:mod:`edge_core.cli.command_line`), whose ``main`` puts in place the handling that
unwinds a running command.

Before :func:`main` runs, the signal is still Python's: while the interpreter starts (an
end by the signal, no output, which a shell reports as 130 or 143 all the same), while
``site`` runs the environment's ``.pth`` files (Python's own fatal error, exit 1), and
while the script imports this module and :mod:`edge_core` (which imports nothing;
under ``python -m edge_core.cli``, while ``runpy`` imports :mod:`edge_core` and
:mod:`edge_core.cli`, which import nothing either, then this module). This
module imports nothing either: ``os`` and ``sys`` are loaded by the interpreter's start,
and so is the C module ``_signal``, used here rather than :mod:`signal` (whose ``enum``
wrappers would import ``enum`` and more before the handlers are set; the command line
imports them afterwards).
"""

import os
import sys

TYPE_CHECKING = False  # not typing's: nothing is imported before the handlers are set
if TYPE_CHECKING:
    from signal import SIGINT, SIGTERM
    from signal import signal as set_handler
else:  # the same functions, without signal.py's enum wrappers (loaded with the interpreter)
    from _signal import SIGINT, SIGTERM
    from _signal import signal as set_handler

__all__ = ["main"]


def main() -> int:
    """Handle SIGINT and SIGTERM, then run the ``edge`` command line; its exit code."""
    set_handler(SIGINT, _exit_at_once)
    set_handler(SIGTERM, _exit_at_once)
    from edge_core.cli.command_line import main as command_line  # it replaces them

    return command_line()


def _exit_at_once(signum: int, frame: object) -> None:
    """End the process now: 128 + the signal's number, and the line the command line says.

    Nothing is raised (a ``KeyboardInterrupt`` inside an import can be swallowed by a
    weak-reference callback and printed as "Exception ignored"), and nothing is imported.
    """
    what = b"terminated (SIGTERM)" if signum == SIGTERM else b"interrupted"
    said = [(2, b"edge: " + what + b"\n")]
    if "--json" in sys.argv[1:]:  # as the command line's report: one document on stdout
        said.append((1, b'{\n  "ok": false,\n  "error": "' + what + b'"\n}\n'))
    for fd, data in said:
        try:
            os.write(fd, data)
        except OSError:  # a closed pipe or terminal: the exit code still says it
            continue
    os._exit(128 + signum)
