"""Print what ``edge run pipeline-auto.toml --json`` tried, and check its text.

``python -m edge_ocr_example.auto_report RUN.json`` prints how the candidates were chosen
(measured, or a stored measurement reused, and what was timed) and, per stage, every
candidate tried (backend, outcome — ``chosen``, ``passed`` every gate but not chosen, or
``refused`` with its layer — the reason, and its measured p50 over how many samples),
and checks that each stage has exactly one ``chosen`` candidate and that the page's text
equals the direct run's (``bundle.json``'s ``example_text`` in the run file's
directory's bundle). Exit 0 when both hold, 1 when not, 2 when the file is unreadable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_ocr_example.bundle_layout import DESCRIPTION

__all__ = ["check_run", "main"]


def check_run(run: Mapping[str, Any], expected_text: Sequence[str]) -> list[str]:
    """The problems of one ``edge run --json`` document (empty: none)."""
    problems = []
    for stage in run["plan"]["stages"]:
        chosen = [c for c in stage.get("candidates", []) if c["outcome"] == "chosen"]
        if len(chosen) != 1:
            problems.append(f"stage {stage['id']}: {len(chosen)} chosen candidates")
    text = [line["text"] for result in run.get("results", []) for line in result["lines"]]
    if text != list(expected_text):
        problems.append(f"text differs from the direct run's: {text} != {list(expected_text)}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``auto_report RUN.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m edge_ocr_example.auto_report RUN.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
        expected = json.loads((path.parent / DESCRIPTION).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    selection = run["plan"].get("selection") or {}
    if selection.get("decision") in ("measured", "reused", "not-measured"):
        timed = (selection.get("workload") or {}).get("note", "-")
        print(f"selection: {selection['objective']}; {selection['note']}; timed on {timed}")
    for stage in run["plan"]["stages"]:
        for candidate in stage.get("candidates", []):
            line = f"{stage['id']}: {candidate['backend']} {candidate['outcome']}"
            if candidate["outcome"] == "refused":
                line += f" at {candidate['layer']}: {candidate['reason']}"
            elif candidate["outcome"] != "chosen":
                line += f": {candidate['reason']}"
            measured = candidate.get("measured") or {}
            if measured.get("p50_s") is not None:
                line += (f" [p50 {measured['p50_s'] * 1e3:.0f} ms over "
                         f"{measured['samples']} sample(s)]")
            print(line)
    print(f"classifier calls: {run['latency_p50_ms'].get('classify', 0.0) / 1e3:.2f} s; "
          f"open {run['open_s']:.1f} s")
    problems = check_run(run, expected["example_text"])
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print("text equals the direct run's; one chosen candidate per stage")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
