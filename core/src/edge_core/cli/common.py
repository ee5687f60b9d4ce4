"""Helpers shared by the ``edge`` commands: exit codes, errors, JSON output, plugins.

How an error ends a command (:func:`failure_for`, applied by :func:`edge_core.cli.main`):

* a usage, input or configuration error — :class:`~edge_core.errors.ConfigError` (every
  problem of the file named at once), a ``ValueError`` from checking a request's input —
  exits 2 with one line on stderr (one line each where a failure gives ``lines``: ``edge
  run``'s refused inputs);
* any other :class:`~edge_core.errors.EdgeError` (a refusal, a lost worker) exits 1 with
  one line;
* an unexpected exception exits 1 with one line naming it.

The traceback is printed only with ``--debug`` or ``EDGE_DEBUG=1``.

Every command imports this module, kept answers of ``edge plugins`` and ``edge probe``
too, which import no plugin machinery (``core/tests/plugins/test_import_weight.py``):
what only a checked pipeline needs (:mod:`edge_core.discovery`, which imports the hook
specifications and ``typing``) is imported where it is used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from edge_core.errors import ConfigError, EdgeError, PluginError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any, NoReturn

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PLUGINS = 3


HELP_WIDTH = 88
"""Columns of ``--help`` text, whatever the terminal's width."""
HELP_COLUMN = 18
"""The column where every command's and option's help text starts."""


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` layout of every command: paragraphs wrapped, indented blocks as written.

    A description or epilog paragraph (blank-line separated) whose lines start with
    spaces, or that ends in a colon, is an example block or a heading and is kept as
    written; other paragraphs are wrapped to :data:`HELP_WIDTH` columns.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=HELP_COLUMN, width=HELP_WIDTH)
        self._action_max_length = HELP_COLUMN - 2  # the same column in every command


    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") or line.endswith(":") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(lines), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)


class CommandFailed(EdgeError):
    """Raised by a command to end with an exit code and a message (and a JSON body).

    ``lines``, when given, is what :func:`report_failure` prints on stderr without
    ``--json`` in place of the one-line ``message``: one ``edge:`` line each (a failure
    that names many things, one per line). ``--json``'s ``error`` is ``message`` still.
    """

    def __init__(self, code: int, message: str, body: dict[str, Any] | None = None,
                 lines: Sequence[str] = ()) -> None:
        self.code = code
        self.message = message
        self.body = body or {}
        self.lines = tuple(lines)
        super().__init__(message)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Give a command the ``--json`` and ``--debug`` flags every command has."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    add_debug_flag(parser, default=argparse.SUPPRESS)


def add_debug_flag(parser: argparse.ArgumentParser, default: Any = False) -> None:
    """``--debug``: print the traceback of an error (also ``EDGE_DEBUG=1``)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="print the traceback of an error (also EDGE_DEBUG=1)")


def debug_enabled(args: argparse.Namespace | None) -> bool:
    """True when ``--debug`` was given or ``EDGE_DEBUG`` is set to a true value."""
    if args is not None and getattr(args, "debug", False):
        return True
    return os.environ.get("EDGE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def config_problems(exc: ConfigError) -> list[str]:
    """Every problem a configuration error carries (one for a plain ``ConfigError``).

    Each reads ``path (stage 'ID'): reason: value`` (:attr:`ConfigError.located`): a path
    into the file names a stage by its position, followed by its id when it has one.
    """
    problems = getattr(exc, "problems", None) or (exc,)
    return [problem.located if isinstance(problem, ConfigError) else str(problem)
            for problem in problems]


def error_line(exc: BaseException) -> str:
    """``TYPE: message`` in one line; an error's detail (a worker's traceback) left out.

    The detail is named, for ``--debug`` (whose traceback shows it) and ``--json`` (whose
    ``detail`` holds it).
    """
    if not isinstance(exc, EdgeError):
        return " ".join(f"{type(exc).__name__}: {exc}".split("\n"))
    line = f"{type(exc).__name__}: {exc.summary}"
    if exc.detail is not None:
        line += " (--debug or EDGE_DEBUG=1 prints the worker's traceback)"
    return line


def error_fields(exc: BaseException) -> dict[str, Any]:
    """``{"error_detail": {"field", "reason", "value"}}`` for a worker's error, else ``{}``.

    The field, reason and value a request's worker error held, as the worker sent them
    (``RequestFailed.error_detail``: :mod:`edge_contracts.error_details`); nothing for an
    error without them (a worker's error whose value was no JSON scalar, any other error).
    """
    from edge_contracts.error_details import ErrorDetail  # a failure's path only

    detail = getattr(exc, "error_detail", None)
    return {"error_detail": detail.to_dict()} if isinstance(detail, ErrorDetail) else {}


def failure_for(exc: BaseException, what: str = "") -> CommandFailed:
    """The exit code and one-line message for ``exc`` (see the module docstring).

    ``what`` names the input being handled (``--input``, ``--params``) for input errors.
    """
    if isinstance(exc, CommandFailed):
        return exc
    if isinstance(exc, ConfigError):
        return config_failure(exc)
    from edge_core.stage import FAILED_STAGE_ATTR  # where used: a failure's path only

    stage = getattr(exc, FAILED_STAGE_ATTR, None)  # a stage's load or gate raised it
    where = f"{stage}: " if stage else ""
    body = {"stage": stage} if stage else {}
    if isinstance(exc, EdgeError):
        body.update(error_fields(exc))
        return CommandFailed(EXIT_FAILED, f"{where}{error_line(exc)}",
                             body if exc.detail is None else {**body, "detail": exc.detail})
    if isinstance(exc, ValueError):
        prefix = f"{what}: " if what else ""
        problems = [str(p) for p in getattr(exc, "problems", ())] or [str(exc)]
        return CommandFailed(EXIT_USAGE, f"{where}{prefix}{exc}", {"problems": problems, **body})
    return CommandFailed(EXIT_FAILED, f"{where}internal error: {type(exc).__name__}: {exc} "
                         "(--debug or EDGE_DEBUG=1 prints the traceback)", body)


def config_failure(exc: ConfigError, file: str | None = None) -> CommandFailed:
    """Exit 2 naming every problem of a configuration at once, after the file's name.

    A file that cannot be read or parsed is named with the reason (``p.toml: cannot read
    (No such file or directory)``); problems inside it are listed by their paths.
    """
    problems = config_problems(exc)
    if exc.path == "source" and len(problems) == 1:
        return CommandFailed(EXIT_USAGE, f"{file or exc.value}: {exc.reason}",
                             {"problems": [f"{file or exc.value}: {exc.reason}"]})
    head = f"{file}: " if file else ""
    message = head + (problems[0] if len(problems) == 1 else
                      f"{len(problems)} configuration problems: " + "; ".join(problems))
    body: dict[str, Any] = {"problems": problems}
    if file:
        body["file"] = file
    return CommandFailed(EXIT_USAGE, message, body)


def checked_pipeline(args: argparse.Namespace) -> Any:
    """The pipeline file of ``args`` checked against the installed plugins (exit 2 if not).

    Returns a :class:`~edge_core.preflight.CheckedPipeline`; every problem of every stage
    is named at once (see :mod:`edge_core.preflight`). No worker starts here. The plugins
    named that did not load are warned about (:func:`warn_named_plugins`) whether the
    file passes or not; a refused file's failure lists them all as ``plugin_errors``.
    """
    from edge_core.preflight import check_pipeline

    loaded: list[Any] = []
    try:
        checked = check_pipeline(args.pipeline, getattr(args, "name", None),
                                 loaded=loaded.append)
    except PluginError as exc:
        raise CommandFailed(EXIT_PLUGINS, str(exc)) from exc
    except ConfigError as exc:
        failure = config_failure(exc, args.pipeline)
        if loaded:  # the file was read far enough to load its plugins
            from edge_core.discovery import plugin_errors  # not at import: see the module

            rows = [record.to_json() for record in loaded[0].records]
            warn_named_plugins(rows)
            failure.body["plugin_errors"] = plugin_errors(rows)
        raise failure from exc
    warn_named_plugins(record.to_json() for record in checked.plugins.records)
    return checked


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``PIPELINE`` argument and ``--name`` of every command that opens a pipeline."""
    parser.add_argument("pipeline", metavar="PIPELINE",
                        help="a pipeline file (.toml, .yaml, .json), or a pyproject.toml "
                        "with --name")
    parser.add_argument("--name", metavar="NAME",
                        help="which of the pyproject.toml's [tool.edge.pipelines] to use")


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: workers' output on stderr instead of a log file per worker."""
    parser.add_argument("--verbose", action="store_true",
                        help="show the workers' output on stderr (default: a log file per "
                        "worker, in the folder named by 'edge: worker logs:', removed at "
                        "exit, logs and all, when every worker's log is empty and the "
                        "command succeeded)")


def examples(*commands: str) -> str:
    """An ``examples:`` epilog for a command's ``--help`` (one command a line)."""
    return "examples:\n" + "\n".join(f"  {command}" for command in commands)


def add_command(sub: argparse._SubParsersAction[Any], name: str, summary: str,
                description: str, *example_lines: str) -> argparse.ArgumentParser:
    """A subcommand with its one-line summary, its description and its examples."""
    return sub.add_parser(name, help=summary, description=description,  # type: ignore[no-any-return]
                          epilog=examples(*example_lines) if example_lines else None,
                          formatter_class=HelpFormatter)


def say(message: str) -> None:
    """One progress or notice line on stderr, prefixed ``edge:``."""
    print(f"edge: {message}", file=sys.stderr, flush=True)


def print_json(data: object) -> None:
    """Write one JSON document to stdout."""
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def report_failure(args: argparse.Namespace | None, failure: CommandFailed) -> int:
    """Print a failure (as JSON when ``--json`` was given) and return its exit code.

    The message is one line (or, without ``--json``, the failure's ``lines``, one
    ``edge:`` line each); with ``--debug`` / ``EDGE_DEBUG=1`` the traceback of what caused
    it follows on stderr.
    """
    if debug_enabled(args):
        import traceback

        cause = failure.__cause__ or failure
        traceback.print_exception(cause, file=sys.stderr)
    message = " ".join(failure.message.split("\n"))
    if getattr(args, "json", False):
        print_json({"ok": False, "error": message, **failure.body})
    else:
        for line in failure.lines or (message,):
            text = " ".join(line.split("\n"))
            print(f"edge: {text}", file=sys.stderr)
    return failure.code


def env_true(name: str) -> bool:
    """True when environment variable ``name`` is set to a true value (``1``, ``yes``...)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def strict_plugins() -> bool:
    """True when ``EDGE_STRICT_PLUGINS`` asks for plugin failures to be fatal."""
    return env_true("EDGE_STRICT_PLUGINS")


def load_plugins_or_fail() -> Any:
    """Load plugins (warning about named ones that failed); strict-mode failure: exit 3."""
    from edge_core.plugins import load_plugins

    try:
        plugins = load_plugins()
    except PluginError as exc:
        raise CommandFailed(EXIT_PLUGINS, str(exc)) from exc
    warn_named_plugins(record.to_json() for record in plugins.records)
    return plugins


def warn_named_plugins(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Warn on stderr about each plugin the user named that did not load; the warnings.

    ``rows`` are plugin rows (:meth:`~edge_core.discovery.PluginRecord.to_json`). Named
    are the local modules a configuration's ``plugins`` lists and, while ``EDGE_PLUGINS``
    is set, every entry point (it names each one, and one that is not installed is a
    failed row of its own). A failure of a plugin nobody named is only listed, by ``edge
    plugins`` and ``edge probe``; ``EDGE_STRICT_PLUGINS=1`` makes any failure fatal.
    """
    rows = list(rows)
    if not any(row.get("error") for row in rows):  # a kept listing has none
        return []
    from edge_core.discovery import plugin_errors  # not at import: see the module

    warnings = []
    for failure in plugin_errors(rows):
        if failure["named_by"] is None:
            continue
        where = ("named by EDGE_PLUGINS" if failure["named_by"] == "EDGE_PLUGINS"
                 else "named by a configuration's plugins")
        warnings.append(f"warning: plugin {failure['plugin']!r} ({where}) did not load: "
                        f"{failure['error']}")
    for warning in warnings:
        say(warning)
    return warnings


class PluginErrorsOnFailure:
    """A ``with`` block whose failure carries ``plugin_errors`` in its JSON body.

    A :class:`CommandFailed` gets the list added; any other exception (an interrupt
    aside) is turned into its failure by :func:`failure_for` first, as the command's
    caller would, so the exit code and message are the same as without the block.
    """

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        """Add ``errors`` (:func:`plugin_errors`) to a failure of the block."""
        self.errors = errors

    def __enter__(self) -> PluginErrorsOnFailure:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if isinstance(exc, CommandFailed):
            exc.body.setdefault("plugin_errors", self.errors)
        elif isinstance(exc, Exception):
            failure = failure_for(exc)
            failure.body.setdefault("plugin_errors", self.errors)
            raise failure from exc


class UsageError(Exception):
    """A command line argparse refused: the message and the refusing command's usage."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        # where used: a plain ``edge plugins`` imports this module, and no edge_contracts
        from edge_contracts.error_copies import whole_reduction

        return whole_reduction(self)


def report_usage_error(error: UsageError, as_json: bool) -> int:
    """Print a refused command line and return exit code 2.

    The usage and ``PROG: error: MESSAGE`` go to stderr as argparse writes them; with
    ``--json`` stdout also gets the one JSON document every refusal gets
    (``{"ok": false, "error": ...}``).
    """
    sys.stderr.write(error.usage)
    print(error.message, file=sys.stderr)
    if as_json:
        print_json({"ok": False, "error": error.message})
    return EXIT_USAGE


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0: {text!r}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (both included).

    A count that sizes a run (``edge profile --requests``) has a ceiling, so that a typo
    of a few digits is refused by name at once instead of starting a run that never ends.
    An integer too long to read (more digits than Python parses) is over the ceiling too.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            digits = text.strip().removeprefix("+")
            if digits.isascii() and digits.isdigit():  # beyond int()'s digit limit
                raise argparse.ArgumentTypeError(f"must be at most {high}: "
                                                 f"{text[:40]!r}...") from None
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}: {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}: {text!r}")
        return value

    parse.__name__ = f"integer from {low} to {high}"
    return parse


def non_negative_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds of at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds of at least 0: "
                                         f"{text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0: "
                                         f"{text!r}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (request parameters).

    Read as the wire reads JSON (:func:`edge_contracts.jsonvalues.strict_loads`): ``NaN``,
    ``Infinity``, a number too large for a float (``1e999``) and a repeated key are
    refused here, as JSON has none of them: a request would refuse them anyway, but only
    once the pipeline is open, input by input.
    """
    from edge_contracts.jsonvalues import strict_loads  # where used: not every command

    try:
        value = strict_loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    except (ValueError, RecursionError) as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc or 'nested too deeply'}): "
                                         f"{text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object: {text!r}")
    return value


def check_output(path: str, option: str, *, directory: bool = False) -> None:
    """Refuse (exit 2) an output path that cannot be written, before anything opens.

    A file output must not be a directory, a directory output not an existing file; the
    nearest existing folder above it (missing ones are created when it is written) must be
    a directory this process can write in.
    """
    from pathlib import Path  # where used: `edge plugins` and `edge probe` import no pathlib

    target = Path(path)
    try:
        if directory and target.exists() and not target.is_dir():
            raise CommandFailed(EXIT_USAGE, f"{option} {path}: exists and is not a directory")
        if not directory and target.is_dir():
            raise CommandFailed(EXIT_USAGE,
                                f"{option} {path}: is a directory (give a file path)")
        above = target.absolute().parent
        while not above.exists() and above != above.parent:
            above = above.parent
    except OSError as exc:  # a name too long, a loop of links: no file can be made there
        raise CommandFailed(EXIT_USAGE, f"{option} {path}: cannot be written: "
                            f"{exc.strerror or exc}") from None
    if not above.is_dir():
        raise CommandFailed(EXIT_USAGE, f"{option} {path}: {above} is not a directory")
    if not os.access(above, os.W_OK | os.X_OK):
        raise CommandFailed(EXIT_USAGE, f"{option} {path}: cannot write in {above}")


class CommandParser(argparse.ArgumentParser):
    """The ``edge`` parser: remembers its subcommands' action, so the reference can walk them.

    Subcommand parsers are made of the same class (argparse creates them from the
    parent's), so every level of ``edge hub devices`` keeps its own :attr:`subcommands`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subcommands: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
        """The action holding this parser's subcommands (``choices``: name to parser)."""

    def add_subparsers(self, **kwargs: Any) -> Any:
        """Add the subcommand action as argparse does, and remember it."""
        action = super().add_subparsers(**kwargs)
        self.subcommands = action
        return action

    def error(self, message: str) -> NoReturn:
        """Raise :class:`UsageError` (exit 2, printed by :func:`report_usage_error`)."""
        raise UsageError(f"{self.prog}: error: {message}", self.format_usage())


class PluginCommands:
    """What a plugin's ``edge_register_commands`` adds its subcommands to.

    ``add_parser`` takes what :meth:`argparse._SubParsersAction.add_parser` takes; the
    command is parsed like a built-in one, but its ``help`` line is kept here instead of
    in the built-in list, so ``edge --help`` can show it under the plugin's distribution.
    """

    def __init__(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        self.sub = sub
        self.added: list[tuple[str, str]] = []
        """Each command added so far: its name and its one-line help."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add subcommand ``name`` (its ``help`` listed under the plugin's distribution)."""
        text = kwargs.pop("help", None)
        self.added.append((name, str(text or kwargs.get("description") or "").split("\n")[0]))
        return self.sub.add_parser(name, **kwargs)


def add_plugin_commands(
    parser: argparse.ArgumentParser,
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    as_json: bool = False,
    debug: bool = False,
) -> int | None:
    """Let plugins add their subcommands to ``sub``; an exit code when loading failed.

    Each plugin's commands are listed in ``parser``'s help under its distribution, after
    the built-in ones (the epilog's "commands added by installed plugins"). A plugin that
    fails to load under ``EDGE_STRICT_PLUGINS=1`` ends the command here, before its own
    arguments are parsed, so the caller says what its command line asked for: ``as_json``
    (``--json`` is on it) prints the failure as the JSON document every command's strict
    failure is (``{"ok": false, "error": ...}``) instead of the line on stderr, ``debug``
    adds the traceback (see :func:`report_failure`); exit 3 either way.
    """
    from edge_core.plugins import load_plugins

    try:
        plugins = load_plugins()
    except PluginError as exc:
        failure = CommandFailed(EXIT_PLUGINS, str(exc))
        failure.__cause__ = exc
        return report_failure(argparse.Namespace(json=as_json, debug=debug), failure)
    listed: dict[str, list[tuple[str, str]]] = {}
    for record in plugins.records:
        if "edge_register_commands" not in record.hooks or not record.loaded:
            continue
        registry = PluginCommands(sub)
        answer = plugins.call_one(record.name, "edge_register_commands", subparsers=registry)
        if answer.error:
            print(f"edge: plugin {answer.plugin!r} failed to add commands: {answer.error}",
                  file=sys.stderr)
        owner = (f"{record.distribution} {record.version}" if record.distribution
                 else f"plugin {record.name}")
        listed.setdefault(owner, []).extend(registry.added)
    if listed:
        import textwrap

        lines = ["commands added by installed plugins:"]
        for owner, commands in sorted(listed.items()):
            lines.append(f"  from {owner}:")
            for name, text in commands:
                lines += textwrap.wrap(text, HELP_WIDTH,
                                       initial_indent=f"    {name:<{HELP_COLUMN - 4}}",
                                       subsequent_indent=" " * HELP_COLUMN)
        parser.epilog = "\n".join(lines) + "\n\n" + (parser.epilog or "")
    return None


def worker_logs(verbose: bool, notice: Any = None) -> Any:
    """Send workers' output to a fresh log directory (returned), or to stderr when verbose.

    Either way it never reaches this process's stdout (see ``edge_core.host.worker_logs``).
    ``notice`` (e.g. :func:`say`) is told ``worker logs: DIR`` before any worker starts.
    A directory made here is removed when the process exits if every log in it is still
    empty (no worker wrote anything, or none started), its empty logs with it; one where a
    worker wrote is kept whole (:func:`edge_core.host.worker_logs.remove_if_silent`), and
    so is the one a command that failed named (:func:`end_worker_logs`).
    ``EDGE_WORKER_LOG_DIR``'s is left as it is. The paths the command reports
    (``worker_logs``, each worker's ``log``) are the ones used while it ran. The setting
    lasts as long as the command: :func:`end_worker_logs` undoes it.
    """
    import tempfile
    from pathlib import Path

    from edge_core.host.worker_logs import LOG_DIR_ENV, log_directory, set_log_directory

    global _named_logs, _set_before, _env_before
    if verbose:
        popped = os.environ.pop(LOG_DIR_ENV, None)
        if _env_before is None:
            _env_before = popped
        previous = set_log_directory(None)
        _named_logs = None
    else:
        directory = log_directory()
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="edge-worker-logs-"))
            import atexit

            atexit.register(_remove_logs_at_exit, directory)
        previous = set_log_directory(directory)
        _named_logs = directory
    if _set_before is None:  # the first call of the command: what it ends with again
        _set_before = (previous,)
    if verbose:
        return None
    if notice is not None:
        notice(f"worker logs: {directory}")
    return directory


_named_logs: Any = None
"""The log directory the running command named (:func:`worker_logs`), if any."""

_set_before: tuple[Any] | None = None
"""The log directory set before the running command's :func:`worker_logs` (in a
tuple: ``(None,)`` when none was), put back as the command ends."""

_env_before: str | None = None
"""``EDGE_WORKER_LOG_DIR``'s value, when the running command's ``--verbose`` took it out
of the environment (its workers log to stderr), put back as the command ends."""


def end_worker_logs(failed: bool) -> None:
    """The command has ended: the log setting it made is undone; a failed one keeps its folder.

    What the command line calls as each command ends. The log directory set before the
    command's :func:`worker_logs` is set again, and ``EDGE_WORKER_LOG_DIR`` is put back
    where ``--verbose`` took it out: the next command run in this process (``main(argv)``
    called again, by a test or a script that embeds the command line) logs to a fresh
    folder of its own, or to ``EDGE_WORKER_LOG_DIR``'s, as the first did. Before, it
    logged into the folder the first command had made (or to stderr after a
    ``--verbose`` one, ``EDGE_WORKER_LOG_DIR`` gone from the environment).

    A command that failed (any exit code but 0) named the folder as where to look
    (``edge: worker logs: DIR`` on stderr, ``worker_logs`` under ``--json``): it is kept
    at exit whatever its logs, made if no worker ever did
    (:func:`edge_core.host.worker_logs.keep_log_directory`). Before, a failed ``edge
    profile`` or ``edge conformance`` whose workers wrote nothing named a folder that was
    gone once it exited. One that succeeded leaves it to the removal of silent folders.
    """
    global _named_logs, _set_before, _env_before
    named, _named_logs = _named_logs, None
    set_before, _set_before = _set_before, None
    env_before, _env_before = _env_before, None
    if set_before is not None or env_before is not None:
        from edge_core.host.worker_logs import LOG_DIR_ENV, set_log_directory

        if set_before is not None:
            set_log_directory(set_before[0])
        if env_before is not None:
            os.environ[LOG_DIR_ENV] = env_before
    if failed and named is not None:
        import contextlib

        from edge_core.host.worker_logs import keep_log_directory

        with contextlib.suppress(OSError):  # it cannot be made: the failure stands as it is
            keep_log_directory(named)


def _remove_logs_at_exit(directory: Any) -> None:
    """At exit: retire every worker still running, then remove ``directory`` if silent.

    A worker writes as it ends (a runtime's shutdown warnings, its own exit hooks): it is
    retired first (:func:`edge_core.host.exit_cleanup.retire_all`; idempotent, verified),
    so that what it wrote is in its log when the folder is judged, never written into a
    folder already removed. Before, where this hook ran before the workers' own (a process
    that ran a command after another had started workers), a worker still running was
    retired after its folder was gone, and what it said then was lost.
    """
    from edge_core.host.exit_cleanup import retire_all
    from edge_core.host.worker_logs import remove_if_silent

    retire_all()
    remove_if_silent(directory)
