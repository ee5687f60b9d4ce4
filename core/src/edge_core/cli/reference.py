"""The command-line reference (``docs/cli.md``), generated from the commands' own ``--help``.

Run ``python -m edge_core.cli.reference docs/cli.md`` after changing a command, its
options or its help; ``--check`` exits 1 when the file is out of date (a test of
edge-core runs that comparison). The commands installed plugins add (``edge serve``,
``edge derive``, ``edge hub``) are included when their distributions are installed, as
in the development environment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["commands", "main", "render"]

HEAD = """\
# Command line reference

Generated from each command's `--help` by `python -m edge_core.cli.reference
docs/cli.md` (a test checks that it is current), with every installed plugin's
commands. Every command prints one JSON document with `--json`, and `--debug` (or
`EDGE_DEBUG=1`) adds the traceback to an error. A request that failed in a worker is
one line naming the worker's error type and message; the worker's traceback is left to
`--debug` and to the `--json` document's `detail`, and the field, reason and value
its error held, when the worker sent them, to its `error_detail` (`{"field", "reason",
"value"}`; `edge run --input`'s failed results carry it too). A path into the pipeline
file names a stage by its position, with its id after the path (`stages[0].backend.name (stage
'detect'): ...`); an error of a stage once it loads or runs names it by its id
(`stages[detect].numerics: ...`): [config.md](config.md#how-an-error-names-a-stage).

| exit code | meaning |
|---|---|
| 0 | success |
| 1 | the command ran and the answer is negative: a refusal, a failed check, a requested \
backend unavailable, a conformance run in which nothing passed, an `edge run` in which \
some input failed (each named; the others' answers reported), and a request the \
pipeline's own code failed, however good its input: a transform that raised \
(`TransformFailed`), returned no mapping of input names (`TransformReturnInvalid`) or \
built inputs the next stage refused (`TransformOutputRefused`, naming that stage, the \
transform and the refusal) |
| 2 | a usage, input or configuration problem: one line on stderr naming the file and \
every problem at once, before any worker starts |
| 3 | a plugin failed to load under `EDGE_STRICT_PLUGINS=1` (a command that loads \
plugins: every one but `edge manifest`, `edge qualify`, `edge matrix` and `edge cleanup`) |
| 130, 143 | interrupted by SIGINT (Ctrl-C) or SIGTERM: what the command had started \
(workers, bundle copies, shared memory) is retired and removed first, then one line says \
so (`edge: interrupted`, `edge: terminated (SIGTERM)`; with `--json` also the document \
`{"ok": false, "error": ...}`); another Ctrl-C or SIGTERM meanwhile is ignored (the \
retirement is bounded by its deadlines), and one after the command ended leaves its output \
and exit code as they are. The `edge` script and `python -m edge_core.cli` handle both \
from their first step, before they import the command line (no traceback, whenever they \
come); before that, while the interpreter itself starts and runs the environment's \
`.pth` files, they are Python's: an end by the signal with no output (which a shell \
reports as 130 or 143 too) or Python's own error |

Environment: `EDGE_PLUGINS=a,b` loads only those plugins; `EDGE_STRICT_PLUGINS=1` makes a
plugin that fails to load fatal; `EDGE_TRACE_HOOKS=1` traces every hook call;
`EDGE_WORKER_LOG_DIR` names the folder for workers' log files: every command that starts
workers (`edge run`, `plan`, `profile`, `conformance`, `serve`) writes their output (a
runtime's warnings, a worker's traceback) to a log file per worker there, or in a fresh
folder, named on stderr (`edge: worker logs: DIR`) and as `worker_logs` in the `--json`
document, never to stdout nor between the command's own lines; `--verbose` shows it on
stderr instead (`worker_logs` null). A fresh folder is removed at exit, its logs with it,
when every worker's log is empty and the command succeeded; one where any worker wrote
something is kept whole, its empty logs included, and so is the folder of a command that
failed (any exit code but 0), which it names as where to look, even where no worker
wrote or started. `EDGE_WORKER_LOG_DIR`'s folder and logs are left as they are (made
when a command that failed names it before any worker did). The
`--json` document names the folder and each worker's log as they were during the run.
A plugin you name that does
not load (an `EDGE_PLUGINS` name no installed distribution has, a module a configuration's
`plugins` lists that does not import) is never skipped in silence: every command that
loads plugins warns about it on stderr (`edge: warning: plugin 'nope' (named by
EDGE_PLUGINS) did not load: not installed: ...`), `edge plugins` lists it with its
error, `edge probe --json`, `edge plan --json`, `edge run --json` and
`edge profile --json` list every plugin that did not load under `plugin_errors`
(`{"plugin", "error", "named_by"}`, `named_by` being `EDGE_PLUGINS`, `configuration` or
null for one nobody named; an empty list when every plugin loaded), in a failure's
document too once the pipeline file is read, and so do the profile files
`edge run --profile` and `edge profile --out` write (`edge profile`'s also when the run
failed); `edge probe --json` lists there first, in the same shape, each plugin whose
probe failed (raised, timed out or answered something else). Under
`EDGE_STRICT_PLUGINS=1` a plugin that does not load is fatal (exit 3) to every command
that loads plugins: `edge` itself (its help lists the plugins' commands) and every
command but `edge manifest`, `edge qualify`, `edge matrix` and `edge cleanup`. Those
four load no plugin, as nothing they read or answer depends on one (a bundle's files,
records, the temporary folder): neither variable touches them, and a broken plugin is
neither warned about there nor fatal.
"""


def commands(parser: argparse.ArgumentParser, prefix: str = "edge"
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every subcommand of ``parser`` (a :class:`CommandParser`), depth first, with its name."""
    action = getattr(parser, "subcommands", None)
    for name, child in (action.choices.items() if action is not None else ()):
        yield f"{prefix} {name}", child
        yield from commands(child, f"{prefix} {name}")


def render() -> str:
    """The reference page: ``edge --help``, then every command's ``--help``."""
    from edge_core.cli.command_line import parser_and_commands
    from edge_core.cli.common import add_plugin_commands

    parser, sub = parser_and_commands()
    add_plugin_commands(parser, sub)
    parts = [HEAD, "## edge\n", "```text", parser.format_help().rstrip(), "```\n"]
    for name, child in commands(parser):
        parts += [f"## {name}\n", "```text", child.format_help().rstrip(), "```\n"]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page to a file (or stdout); ``--check`` compares instead."""
    parser = argparse.ArgumentParser(prog="python -m edge_core.cli.reference",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("out", nargs="?", default="docs/cli.md", help="the page to write")
    parser.add_argument("--check", action="store_true", help="exit 1 when it differs")
    args = parser.parse_args(argv)
    text = render()
    path = Path(args.out)
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is out of date: run python -m edge_core.cli.reference {path}",
                  file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
