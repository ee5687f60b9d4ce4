"""What ``python -m edge_ocr_example.page_bundle`` says of the two pipelines it writes.

``pipeline.toml`` is ready once it returns; ``pipeline-auto.toml`` names a ``qnn``
candidate on ``classify-qnn``, a bundle this command does not build (``edge derive``,
from the edge-qnn plugin, makes it; ``make demo`` runs it). A wheel user who ran only
this command is told so, with the command, instead of meeting a missing manifest.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from edge_ocr_example import page_bundle
from edge_ocr_example.page_bundle import (
    AUTO_CLASSIFY,
    AUTO_PIPELINE,
    PageBuild,
    derive_command,
    pipeline_auto_toml,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_says_pipeline_auto_needs_the_derived_bundle_and_how_to_make_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "ocr"

    def build(root: Path, **_: object) -> PageBuild:  # the bundles themselves: not here
        return PageBuild(root, {}, ("a line",))

    monkeypatch.setattr(page_bundle, "build_page_bundles", build)
    assert page_bundle.main([str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == f"ready: edge run {out}/pipeline.toml --input {out}/page.png"
    assert printed[-1] == (
        f"not ready: {out}/{AUTO_PIPELINE} needs {out}/{AUTO_CLASSIFY}, which this command "
        f"does not build: edge derive qnn-static {out}/classify --bucket 4x3x48x192 --out "
        f"{out}/{AUTO_CLASSIFY} (edge derive comes with the edge-qnn plugin: pip install "
        "'edge-qnn[derive]')")


def test_the_derive_command_is_the_one_make_demo_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (ran,) = re.findall(r"^\t\$\(BIN\)/(edge derive qnn-static .*)$", makefile, re.MULTILINE)
    assert ran == derive_command(Path("$(OCR)"))


def test_pipeline_auto_toml_names_what_it_needs_where_its_candidate_reads_it() -> None:
    text = pipeline_auto_toml()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert f"#   {derive_command(Path())}" in comments  # run from the file's folder
    assert "pip install 'edge-qnn[derive]'" in comments[-1]
    (classify,) = [s for s in tomllib.loads(text)["stages"] if s["id"] == "classify"]
    qnn = classify["candidates"][0]
    assert qnn["backend"]["name"] == "qnn"
    assert qnn["manifest"].split("/")[0] == derive_command(Path()).split("--out ")[1]
