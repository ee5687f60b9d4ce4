"""What ``python -m edge_ocr_example.page_bundle`` says of the two pipelines it writes.

``pipeline.toml`` is ready once it returns; ``pipeline-auto.toml`` names a ``qnn``
candidate on ``classify-qnn``, a bundle this command does not build (``edge derive``,
from the edge-qnn plugin, makes it; ``make demo`` runs it). A wheel user who ran only
this command is told so, with the command, instead of meeting a missing manifest, and
what to install first only where edge-qnn or its derive extra is missing.
"""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest

from edge_ocr_example import page_bundle
from edge_ocr_example.derive_tool import derive_missing
from edge_ocr_example.page_bundle import (
    AUTO_CLASSIFY,
    AUTO_PIPELINE,
    PageBuild,
    derive_command,
    pipeline_auto_toml,
)

ROOT = Path(__file__).resolve().parents[2]


def _last_line(out: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> str:
    """The command's last line for ``out`` (the bundles themselves are not built), after
    checking the one before it."""

    def build(root: Path, **_: object) -> PageBuild:  # the bundles themselves: not here
        return PageBuild(root, {}, ("a line",))

    monkeypatch.setattr(page_bundle, "build_page_bundles", build)
    assert page_bundle.main([str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == f"ready: edge run {out}/pipeline.toml --input {out}/page.png"
    return printed[-1]


def _site(folder: Path, *names: str) -> list[str]:
    """A site folder holding copies of the installed ``names``' metadata (dist-info) only."""
    folder.mkdir()
    for name in names:
        dist = distribution(name)
        (meta,) = [f for f in dist.files or () if f.name == "METADATA"]
        info = Path(str(dist.locate_file(meta))).parent
        shutil.copytree(info, folder / info.name)
    return [str(folder)]


def test_where_edge_qnn_and_its_derive_extra_are_installed_the_command_says_run_derive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The development environment has both (``make demo`` runs edge derive): no pip line.

    It said ``pip install 'edge-qnn[derive]'`` even then; the step missing is the derive.
    """
    out = tmp_path / "ocr"
    assert derive_missing() is None
    assert _last_line(out, monkeypatch, capsys) == (
        f"not ready: {out}/{AUTO_PIPELINE} needs {out}/{AUTO_CLASSIFY}, which this command "
        f"does not build: run edge derive qnn-static {out}/classify --bucket 4x3x48x192 "
        f"--out {out}/{AUTO_CLASSIFY} (edge-qnn and its derive extra are installed)")


def test_without_edge_qnn_the_command_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """A wheels user with only the page pipeline's distributions is told to install it."""
    out = tmp_path / "ocr"
    site = _site(tmp_path / "site", "edge-core", "edge-ort-cpu", "onnx", "pillow")
    monkeypatch.setattr(sys, "path", site)  # what importlib.metadata reads by default
    assert _last_line(out, monkeypatch, capsys) == (
        f"not ready: {out}/{AUTO_PIPELINE} needs {out}/{AUTO_CLASSIFY}, which this command "
        f"does not build: edge derive qnn-static {out}/classify --bucket 4x3x48x192 --out "
        f"{out}/{AUTO_CLASSIFY} (edge derive comes with the edge-qnn plugin: pip install "
        "'edge-qnn[derive]')")


def test_edge_qnn_without_its_derive_extra_is_told_what_the_extra_lacks(
        tmp_path: Path) -> None:
    """edge-qnn installed without ``[derive]``: the extra's missing distributions, through
    edge-ort's own ``derive`` extra, are named, with the install that adds them."""
    site = _site(tmp_path / "site", "edge-qnn", "edge-ort")
    assert derive_missing(site) == (
        "edge derive needs edge-qnn's derive extra, and ml-dtypes, onnx, pillow are not "
        "installed: pip install 'edge-qnn[derive]'")
    more = _site(tmp_path / "more", "onnx", "ml_dtypes")
    assert derive_missing([*site, *more]) == (
        "edge derive needs edge-qnn's derive extra, and pillow is not installed: pip "
        "install 'edge-qnn[derive]'")
    assert derive_missing(_site(tmp_path / "all", "edge-qnn", "edge-ort", "onnx",
                                "ml_dtypes", "pillow")) is None
    without_ort = _site(tmp_path / "no-ort", "edge-qnn", "onnx", "ml_dtypes", "pillow")
    assert derive_missing(without_ort) == (
        "edge derive needs edge-qnn's derive extra, and edge-ort is not installed: pip "
        "install 'edge-qnn[derive]'")


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
