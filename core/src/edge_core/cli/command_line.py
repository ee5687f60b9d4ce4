"""The ``edge`` command line: its parser, its commands, its exit codes and its signals.

Its names are the package's too (``from edge_core.cli import main``): :mod:`edge_core.cli`
itself imports nothing, so that ``python -m edge_core.cli``, which imports the package
first, handles Ctrl-C and SIGTERM before this module's imports, as the ``edge`` script
does (:mod:`edge_core.cli.__main__`, :mod:`edge_core.entry`).

Every command accepts ``--json`` and then prints exactly one JSON document on stdout.

Exit codes (the same for every command):

====  ================================================================================
0     success
1     the command ran and the answer is negative: a refusal, a failed verification,
      an unavailable backend that was asked for by name, a conformance run in which
      nothing passed; also an unexpected error
2     usage, input or configuration error (bad arguments, an unreadable input, an
      invalid pipeline file: the file named and every problem of every stage at once,
      unknown backend names with the closest installed ones; all of it checked before
      any worker starts, :mod:`edge_core.preflight`)
3     plugin loading failed while ``EDGE_STRICT_PLUGINS=1`` is set (every command that
      loads plugins: all but :data:`PLUGIN_FREE_COMMANDS`, which load none)
130   interrupted (SIGINT, Ctrl-C); 143 after SIGTERM: what the command had started is
      retired and removed first, then one line says so (another Ctrl-C or SIGTERM
      meanwhile is ignored); from the first step of the ``edge`` script and of ``python
      -m edge_core.cli`` (:mod:`edge_core.entry`, before this module is imported) on
====  ================================================================================

``edge --help`` lists the built-in commands, then those installed plugins add, under
their distribution. Errors are one line on stderr (inside the JSON document with
``--json``); ``--debug`` or ``EDGE_DEBUG=1`` adds the traceback. Output to a closed pipe
(``edge probe --json | head -1``) ends quietly: the rest of the output is dropped and
the exit code is the command's own.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys

from edge_core import __version__
from edge_core.cli import common
from edge_core.cli.pipes import ClosedPipeGuard

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

__all__ = ["BUILTIN_COMMANDS", "PLUGIN_FREE_COMMANDS", "build_parser", "main",
           "parser_and_commands"]

BUILTIN_COMMANDS = ("run", "plan", "probe", "plugins", "manifest", "profile", "qualify",
                    "matrix", "conformance", "cleanup")
"""The built-in commands, in the order ``edge --help`` lists them: the everyday ones first.
Each is the module ``edge_core.cli.<name>_cmd``, imported only when it is needed: a
command imports its own module alone (``edge probe`` never pays for ``edge profile``'s
imports), help imports them all."""

PLUGIN_FREE_COMMANDS = ("manifest", "qualify", "matrix", "cleanup")
"""The built-in commands that load no plugin: nothing they read or answer depends on one
(a bundle's files, records, the temporary folder). ``EDGE_PLUGINS`` and
``EDGE_STRICT_PLUGINS`` do not touch them: no plugin is imported, none is warned about,
and a broken one is no exit 3 there (docs/cli.md says so; every other command, and
``edge`` with no command, loads the plugins and exits 3 under ``EDGE_STRICT_PLUGINS=1``)."""


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"edge_core.cli.{name}_cmd")


DESCRIPTION = """\
Run ML model stages (an OCR pipeline, a text generator) on the accelerators of this
machine: memory admitted before anything loads, the device each stage really ran on
checked, every worker retired and verified."""

EPILOG = """\
start with:
  edge probe                                  which backends run here, and why not
  edge run PIPELINE --input FILE              read your own file with a pipeline
  edge COMMAND --help                         a command's options, defaults and examples

Every command has --json (one JSON document on stdout). Exit codes: 0 ok; 1 the answer
is negative (refused, failed, unavailable); 2 a usage, input or configuration problem
(every problem of a pipeline file named at once, before any worker starts); 3 a plugin
failed to load under EDGE_STRICT_PLUGINS=1."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with the built-in commands (plugin commands are added by main)."""
    return parser_and_commands()[0]


def parser_and_commands(only: str | None = None) -> tuple[
        argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The parser, and the subparsers action its commands (and plugins') are added to.

    ``only`` (a built-in command's name) registers that command alone: what ``main``
    does when the command line names one, so that nothing else is imported.
    """
    parser = common.CommandParser(
        prog="edge", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=common.HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"edge-core {__version__}")
    common.add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in BUILTIN_COMMANDS if only is None else (only,):
        _command_module(name).register(sub)
    return parser, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``edge`` command line; returns the process exit code.

    Without ``argv`` (the process's own command line: the ``edge`` script, ``python -m
    edge_core.cli``) the process ends right after this returns, so everything still
    reachable is frozen for the cycle collector first (:func:`gc.freeze`): the
    interpreter's teardown then frees it by reference counting alone instead of walking
    every object in its final collections (0.06-0.3 s after ``edge run`` here). ``atexit``
    handlers still run; ``main(argv)`` from a caller's own process freezes nothing.

    Ctrl-C and SIGTERM end the process's own command with 130 and 143 and one line
    (:class:`_Interrupts`), whenever they come once this runs: while a command module is
    imported or its options parsed, or while the command runs or unwinds; one after it
    ended leaves its exit code. Before, under the ``edge`` script and ``python -m
    edge_core.cli`` alike, :mod:`edge_core.entry` handled them (this module's own
    imports: the same code and line).
    """
    own = argv is None
    try:
        if own:  # the process's own command line: SIGINT and SIGTERM unwind it once
            _interrupts.install()
        status = _main(argv)
    except KeyboardInterrupt as exc:  # outside the command's own handling (its import)
        args_list = sys.argv[1:] if argv is None else list(argv)
        status = _report_interrupt(exc, "--json" in args_list)
    finally:
        if own:  # the atexit hooks and the teardown run on: nothing is left to interrupt
            _interrupts.ignore()
    if own:
        gc.freeze()
    return status


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it unwinds as after Ctrl-C.

    Whatever the command started is retired and removed on the way out (workers, the
    verified copies of bundles, shared memory), then it exits 143 (128 + SIGTERM).
    """


class _Interrupts:
    """SIGINT and SIGTERM for the process's own command line.

    One raises where the command is (``KeyboardInterrupt``, or :class:`Terminated`), so
    that it unwinds: what it started is retired and removed, and it exits 130 or 143.
    Another while that one is being handled (it is the exception in flight, or the
    context of the one in flight), or once it was reported, is ignored (one line on
    stderr says so): closing is bounded (each worker's retirement has its deadline), and
    a second Ctrl-C that cut it short left the rest to the exit hooks, or ended the
    process by the signal, with a traceback. One that was swallowed where nothing could
    take it (a weak-reference callback's "Exception ignored") does not count: the next
    raises again. Once the command has ended, both are ignored for good (:meth:`ignore`):
    Python's teardown resets its handlers to the default action, under which a late
    Ctrl-C ended the process by the signal instead of with its exit code. SIGKILL still
    ends it at once.
    """

    def __init__(self) -> None:
        self.raised: KeyboardInterrupt | None = None
        self.reported = False
        self.noted = False

    def install(self) -> None:
        """Handle SIGINT and SIGTERM.

        A Python handler, not ``SIG_IGN``: a worker started later inherits neither.
        """
        self.raised, self.reported, self.noted = None, False, False
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def ignore(self) -> None:
        """Ignore both from now on (the command has ended: its exit code stands)."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)

    def _unwinding(self) -> bool:
        """Whether the interrupt raised is being handled now, or was reported."""
        if self.reported:
            return True
        current = sys.exc_info()[1]
        for _ in range(64):  # the contexts of the exception in flight: cleanup's own
            if current is None:
                return False
            if current is self.raised:
                return True
            current = current.__context__
        return False

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.raised is not None and self._unwinding():  # let the retirement finish
            if not self.noted:
                self.noted = True
                os.write(2, b"edge: still retiring what the command started; it ends "
                            b"within the retirement deadlines\n")
            return
        self.raised = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        raise self.raised


_interrupts = _Interrupts()


def _report_interrupt(exc: KeyboardInterrupt, as_json: bool) -> int:
    """Say the command was interrupted (on stderr; in the JSON document too); its code."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    # CPython 3.11: a KeyboardInterrupt raised inside code run from a string (dataclasses
    # and namedtuple make their classes so, as a module imports) sets the interpreter's
    # "unhandled KeyboardInterrupt" flag even when it is handled here, and `python -m`
    # then ends the process by SIGINT after its exit code was chosen. Running a string
    # clears the flag first.
    eval("None")  # noqa: S307 - a constant, to clear that flag
    _interrupts.reported = True
    print(f"edge: {what}", file=sys.stderr)
    if as_json:
        common.print_json({"ok": False, "error": what})
    return EXIT_TERMINATED if isinstance(exc, Terminated) else 130


EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit code after SIGTERM (after SIGINT: 130)."""


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    named = _builtin_named(args_list)
    parser, commands = parser_and_commands(named)
    if named is None:
        status = common.add_plugin_commands(parser, commands, as_json="--json" in args_list,
                                            debug="--debug" in args_list)
        if status is not None:
            return status
    try:
        args = parser.parse_args(args_list)
    except common.UsageError as exc:  # what argparse refused: exit 2, JSON with --json
        return common.report_usage_error(exc, "--json" in args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return common.EXIT_USAGE
    original = sys.stdout
    sys.stdout = ClosedPipeGuard(original)
    status = common.EXIT_FAILED
    try:
        status = int(func(args))
    except KeyboardInterrupt as exc:
        status = _report_interrupt(exc, bool(getattr(args, "json", False)))
    except Exception as exc:
        failure = common.failure_for(exc)
        if failure is not exc and failure.__cause__ is None:
            failure.__cause__ = exc  # what --debug prints the traceback of
        status = common.report_failure(args, failure)
    finally:
        sys.stdout.flush()
        sys.stdout = original
        common.end_worker_logs(failed=status != common.EXIT_OK)  # one it named stays
    return status


def _builtin_named(argv: list[str]) -> str | None:
    """The built-in command the first positional argument names, else ``None``.

    No positional argument at all (``edge``, ``edge --help``) lists every command, so
    every built-in one is registered and the plugins' are added too; a built-in command
    never pays for loading plugins, nor for importing the other commands.
    """
    for arg in argv:
        if arg.startswith("-"):
            continue
        return arg if arg in BUILTIN_COMMANDS else None
    return None
