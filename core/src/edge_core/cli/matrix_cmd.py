"""``edge matrix``: aggregate qualification records into Markdown and self-contained HTML."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "matrix"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``matrix`` command."""
    parser = common.add_command(
        sub, NAME, "aggregate qualification records into a matrix report",
        "Read qualification records (files, or folders searched for *.json) and write the "
        "device x model matrix as Markdown and as one self-contained HTML page. Exit 2 when "
        "a record is unreadable or none is found, or --out-dir cannot be written.",
        "edge matrix qualification/", "edge matrix r1.json r2.json --out-dir report")
    common.add_json_flag(parser)
    parser.add_argument("records", nargs="+", metavar="RECORD",
                        help="record files, or directories searched for *.json records")
    parser.add_argument("--out-dir", default="matrix", metavar="DIR",
                        help="where matrix.md and matrix.html go (default ./matrix)")
    parser.add_argument("--title", default="Qualification matrix", metavar="TEXT",
                        help="the report's title (default 'Qualification matrix')")
    parser.set_defaults(func=run)


def _files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.json") if p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            raise common.CommandFailed(common.EXIT_USAGE,
                                       f"records: no such file or directory: {name!r}")
    return found


def run(args: argparse.Namespace) -> int:
    """Read every record, write the two reports, print where they are."""
    from edge_core.evidence.errors import RecordInvalid
    from edge_core.evidence.html_report import render_html
    from edge_core.evidence.markdown_report import render_markdown
    from edge_core.evidence.matrix import build_matrix
    from edge_core.evidence.records import load_record

    common.check_output(args.out_dir, "--out-dir", directory=True)  # exit 2, before reading
    out = Path(args.out_dir)
    pairs = []
    for file in _files(args.records):
        try:
            record = load_record(file)
        except RecordInvalid as exc:
            raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
        href = Path(os.path.relpath(file.resolve(), out.resolve())).as_posix()
        pairs.append((record, href))
    if not pairs:
        raise common.CommandFailed(common.EXIT_USAGE, f"records: none found: {args.records}")
    matrix = build_matrix(pairs)
    out.mkdir(parents=True, exist_ok=True)
    markdown, page = out / "matrix.md", out / "matrix.html"
    markdown.write_text(render_markdown(matrix, title=args.title), encoding="utf-8")
    page.write_text(render_html(matrix, title=args.title), encoding="utf-8")
    counts = {status.value: n for status, n in matrix.counts.items()}
    if args.json:
        common.print_json({"ok": True, "markdown": str(markdown), "html": str(page),
                           "cells": len(matrix.entries), "counts": counts})
        return common.EXIT_OK
    print(f"{len(matrix.entries)} cell(s): "
          + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    print(f"wrote {markdown} and {page}")
    return common.EXIT_OK
