"""Every distribution carries the licence, authors and project URLs that a user sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from .distributions import DIRS, ROOT, project

LICENSE = ROOT / "LICENSE"


def test_the_root_licence_is_the_apache_2_text() -> None:
    text = LICENSE.read_text()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 150  # the full text, not a pointer to it


@pytest.mark.parametrize("directory", DIRS)
def test_each_distribution_has_an_identical_licence_copy(directory: str) -> None:
    meta = project(directory)
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    assert (ROOT / directory / "LICENSE").read_bytes() == LICENSE.read_bytes()


@pytest.mark.parametrize("directory", DIRS)
def test_each_distribution_names_authors_and_urls_that_exist(directory: str) -> None:
    meta = project(directory)
    assert meta["authors"] and all(a.get("name") for a in meta["authors"])
    urls = meta["urls"]
    assert set(urls) >= {"Homepage", "Documentation", "Source"}
    base = urls["Homepage"]
    for key in ("Documentation", "Source"):
        assert urls[key].startswith(base + "/"), (key, urls[key])
        path = ROOT / urls[key].removeprefix(base + "/")
        assert path.exists(), f"{directory}: {key} names {path}, which is not in the repo"


def test_the_readme_of_edge_core_is_written_for_the_package_index() -> None:
    text = (ROOT / "core/README.md").read_text()
    for heading in ("## Install", "## A pipeline", "## The command line", "## Documentation"):
        assert heading in text
    assert "edge-ort-cpu[onnxruntime]" in text


def test_the_top_level_readme_says_ort_cpu_needs_an_onnxruntime() -> None:
    text = (ROOT / "README.md").read_text()
    assert "edge-ort-cpu[onnxruntime]" in text


def test_the_licence_copies_are_all_listed() -> None:
    """No pyproject with a LICENSE copy escapes the identity check above."""
    copies = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("**/LICENSE")
              if ".venv" not in p.parts and "build" not in p.parts and p != LICENSE}
    assert copies <= set(DIRS), copies - set(DIRS)
    assert Path(ROOT / "LICENSE").is_file()
