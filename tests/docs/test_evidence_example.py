"""The committed OCR evidence example (docs/examples/ocr) is what the current code makes.

``docs/examples/ocr_report.py`` profiles and qualifies the page pipeline that ``make
demo`` builds and renders the matrix; this checks the committed result without running
it again: every record is of the current schema and says where it came from, the
profiles are of the current profile schema with every run's ``imports_s`` measured in
the worker, and ``edge matrix`` over the committed records reproduces the committed
``matrix.md`` — so a record, a renderer or the report that drifts apart fails here. The
inputs each profile recorded are those the page pipeline's ``prepare`` makes of the demo
page now (a change to ``prepare`` the example was not remade for fails here), and no file
names a path of the machine that made it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from edge_core.evidence.profiling import PROFILE_SCHEMA
from edge_core.evidence.records import RECORD_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "ocr"
TITLE = "OCR (PP-OCRv4) qualification matrix"


def _json(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def test_every_record_is_of_the_current_schema_with_four_verdicts() -> None:
    records = sorted((EXAMPLE / "records").glob("*.json"))
    assert len(records) >= 4
    statuses = {}
    for path in records:
        record = _json(path)
        assert record["schema"] == RECORD_SCHEMA, path.name
        statuses[path.name] = record["status"]
        if record["status"] != "BLOCKED":
            assert set(record["verdicts"]) == {"functional", "quality", "performance",
                                               "reliability"}, path.name
    # no targets: performance unjudged and never PASS; the targets file judges it
    assert statuses["ort-cpu.json"] == "MET_AS_JUDGED"
    assert _json(EXAMPLE / "records" / "ort-cpu.json")["verdicts"]["performance"][
        "verdict"] == "unjudged"
    assert statuses["ort-cpu-admission4.json"] in {"PASS", "FAILED"}
    assert statuses["ort-directml.json"] == "BLOCKED"


def test_every_profile_is_current_and_measures_imports_in_the_worker() -> None:
    profiles = sorted((EXAMPLE / "profiles").glob("*.json"))
    assert profiles
    for path in profiles:
        profile = _json(path)
        assert profile["schema"] == PROFILE_SCHEMA, path.name
        if not profile["outcome"]["ok"]:
            continue
        for sid, phases in profile["traced"]["stages"].items():
            assert phases["imports_basis"] == "worker", (path.name, sid)
            assert 0 < phases["imports_s"] < phases["worker_start_s"], (path.name, sid)


def test_the_committed_matrix_is_what_edge_matrix_renders_from_the_records(
        tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE / "records", tmp_path / "records")
    done = subprocess.run(
        [sys.executable, "-m", "edge_core.cli", "matrix", "records", "--out-dir", ".",
         "--title", TITLE], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        check=False)
    assert done.returncode == 0, done.stderr
    rendered = (tmp_path / "matrix.md").read_text(encoding="utf-8")
    assert rendered == (EXAMPLE / "matrix.md").read_text(encoding="utf-8")


def test_every_profile_recorded_the_inputs_the_page_pipeline_prepares_now(
        demo_build: Path) -> None:
    """The example's profiles ran the current ``prepare``: the names, dtypes and shapes of
    the inputs it makes of ``make demo``'s page now are those each profile measured with
    (the page frame the pipeline carries grew from 6 numbers to 10 while the example
    still showed 6)."""
    from edge_ocr_example.page_pipeline import prepare

    page = demo_build / "build" / "ocr" / "page.png"
    made = {name: {"dtype": str(array.dtype), "shape": list(array.shape)}
            for name, array in prepare(str(page)).items()}
    compared = 0
    for path in sorted((EXAMPLE / "profiles").glob("*.json")):
        profile = _json(path)
        if not profile["outcome"]["ok"]:  # failed at open: nothing was prepared
            continue
        for group in profile["baseline"]["groups"]:
            assert group["source"] == "prepare(build/ocr/page.png)", (path.name, group)
            assert group["inputs"] == made, (path.name, group["inputs"], made)
            compared += 1
    assert compared >= 3  # every profile that ran (the BLOCKED one ran nothing)


#: An absolute path in a committed file, other than the kernel's own (``/sys``, ``/proc``,
#: ``/dev``): the checkout, the temporary directory and the home directory are stripped
#: (``.``, ``$TMPDIR``, ``~``), so what is left came from the machine that made the report.
_MACHINE_PATH = re.compile(r"""(?<=["'(\s=])/(?!sys/|proc/|dev/)[A-Za-z][\w.-]*/""")


def test_no_committed_file_names_a_path_of_the_machine_that_made_it() -> None:
    found = {path.relative_to(EXAMPLE).as_posix(): match.group(0)
             for path in sorted(EXAMPLE.rglob("*")) if path.suffix in {".json", ".md", ".html"}
             for match in [_MACHINE_PATH.search(path.read_text(encoding="utf-8"))] if match}
    assert not found, found
