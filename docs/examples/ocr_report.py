"""Rebuild the committed OCR evidence report (docs/examples/ocr/) from scratch.

Run from the repository root with the workspace's virtual environment::

    .venv/bin/python docs/examples/ocr_report.py

It reads ``make demo``'s build (``build/ocr``: the page pipeline, its demo page and
``pipeline-auto.toml`` with the classifier's QNN candidate), writes two variants of the
page pipeline next to it, then for each configuration runs ``edge profile`` → ``edge
qualify`` on the demo page and finally ``edge matrix`` over the records:

- ``ort-cpu`` as built (levels above its admission are skipped and say so), 20
  requests, no product targets: performance ``unjudged``, so the status is
  ``MET_AS_JUDGED``, never ``PASS``; quality is the demo page's CER (its golden set);
- ``ort-cpu`` with admission 4 (concurrency 1, 2 and 4 measured, 20 requests each),
  qualified against ``targets.toml`` (illustrative targets, not a product's): the
  performance verdict is judged on them;
- ``pipeline-auto.toml``: the classifier on ``qnn`` (the HTP simulator here), the other
  stages on ``ort-cpu``, 3 requests (the simulator is slow; the records flag the level
  as below the protocol's 20): one record per stage and tried candidate;
- ``ort-directml``, which cannot run on Linux (a BLOCKED cell with the probe's reason).

Records are of the current schema (``edge.qualification/2``: four verdicts).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD = Path("build/ocr")
OUT = Path("docs/examples/ocr")
EDGE = [sys.executable, "-m", "edge_core.cli"]


def variant(name: str, *, admission: int | None = None, backend: str | None = None,
            target: str | None = None) -> Path:
    """Write ``build/ocr/pipeline-<name>.toml`` from the built pipeline.toml."""
    text = (BUILD / "pipeline.toml").read_text(encoding="utf-8")
    if admission is not None:  # the pipeline's own line replaced, or one added after its name
        head, found, tail = text.partition("\n[")
        if re.search(r"^admission = \d+$", head, flags=re.MULTILINE):
            head = re.sub(r"^admission = \d+$", f"admission = {admission}", head, count=1,
                          flags=re.MULTILINE)
        else:
            head = head.replace('name = "ocr-page"\n',
                                f'name = "ocr-page"\nadmission = {admission}\n', 1)
        text = head + found + tail
    if backend is not None:
        text = text.replace('name = "ort-cpu"', f'name = "{backend}"')
    if target is not None:
        text = text.replace('target = "CPUExecutionProvider"', f'target = "{target}"')
    path = BUILD / f"pipeline-{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def run(*args: str) -> int:
    """Run one command, echoing it; return its exit status."""
    print("$", " ".join(["edge", *args]), flush=True)
    return subprocess.run([*EDGE, *args], check=False).returncode


def main() -> int:
    """Build, profile, qualify and aggregate; returns 0 when the report was written."""
    if not (BUILD / "pipeline-auto.toml").exists() or not (BUILD / "classify-qnn").exists():
        print("build/ocr is missing or incomplete: run make demo first", file=sys.stderr)
        return 2
    cells = [
        ("ort-cpu", BUILD / "pipeline.toml", None),
        ("ort-cpu-admission4", variant("admission4", admission=4), None),
        ("auto-qnn-classifier", BUILD / "pipeline-auto.toml", None),
        ("ort-directml", variant("directml", backend="ort-directml",
                                 target="DmlExecutionProvider"), "DirectML GPU (none here)"),
    ]
    for folder in ("profiles", "records"):
        for old in (OUT / folder).glob("*.json"):
            old.unlink()
    for name, pipeline, device in cells:
        profile = OUT / "profiles" / f"{name}.json"
        requests = "3" if name.startswith("auto") else "20"  # the simulator is slow
        run("profile", str(pipeline), "--input", str(BUILD / "page.png"), "--requests", requests,
            "--out", str(profile))
        labels = ["--device", device] if device else []
        if name == "ort-cpu-admission4":
            labels += ["--configuration", "ort-cpu / CPUExecutionProvider, admission 4",
                       "--targets", str(OUT / "targets.toml")]
        where = (["--out-dir", str(OUT / "records")] if name.startswith("auto")
                 else ["--out", str(OUT / "records" / f"{name}.json")])
        if run("qualify", "--profile", str(profile), *labels, *where) != 0:
            return 1
    status = run("matrix", str(OUT / "records"), "--out-dir", str(OUT),
                 "--title", "OCR (PP-OCRv4) qualification matrix")
    strip_machine_paths(OUT)
    return status


def strip_machine_paths(folder: Path) -> None:
    """Make the committed report machine-independent.

    Records and profiles name the interpreter, the pipeline file and the bundles' staged
    copies by absolute path, which is right for evidence kept on the machine that made
    it. In the committed example the checkout's root becomes ``.``, the temporary
    directory ``$TMPDIR`` and the home directory (the QNN context cache) ``~``.
    """
    root = re.escape(str(Path.cwd().resolve()))
    temp = re.escape(tempfile.gettempdir())
    home = re.escape(str(Path.home()))
    end = r"""(?=["'<\s,;)\]}]|$)"""  # where a path ends in JSON, Markdown or HTML
    rules = [
        (re.compile(root + "/"), ""),  # paths inside the checkout become relative
        (re.compile(root + end), "."),
        (re.compile(r"(?<![\w/.])" + temp + "(?=/)"), "$TMPDIR"),
        (re.compile(r"(?<![\w/.])" + temp + end), "$TMPDIR"),
        (re.compile(r"(?<![\w/.])" + home + "(?=/)"), "~"),
    ]
    for path in sorted(folder.rglob("*")):
        if path.suffix not in {".json", ".md", ".html"}:
            continue
        text = path.read_text(encoding="utf-8")
        cleaned = text
        for pattern, replacement in rules:
            cleaned = pattern.sub(lambda _, r=replacement: r, cleaned)
        if cleaned != text:
            path.write_text(cleaned, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
