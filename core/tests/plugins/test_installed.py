"""Installed distributions read from metadata folders agree with importlib.metadata."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from edge_core.installed import (
    distribution_folder,
    installed_versions,
    metadata_folders,
    recorded_files,
)


def test_versions_agree_with_importlib_metadata_for_what_is_installed() -> None:
    names = ["onnxruntime", "numpy", "pluggy", "edge-core", "no-such-distribution-here"]
    found = installed_versions(names)
    assert found == {n: version(n) for n in names[:-1]}
    folder = distribution_folder("pluggy")
    assert folder is not None
    files = recorded_files(folder)
    assert files is not None and "pluggy/__init__.py" in files


def test_the_first_distribution_of_a_name_on_the_path_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for where, ver in ((first, "1.0"), (second, "2.0")):
        info = where / f"Some_Dist-{ver}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: some-dist\n"
                                       f"Version: {ver}\n\nbody\n")
    legacy = second / "legacy.egg-info"
    legacy.mkdir()
    (legacy / "PKG-INFO").write_text("Name: Legacy.Tool\nVersion: 0.3\n")
    path = [str(first), str(second), str(tmp_path / "missing")]
    assert dict(metadata_folders(path)) == {"some_dist": str(first / "Some_Dist-1.0.dist-info"),
                                            "legacy_tool": str(legacy)}
    assert installed_versions(["Some.Dist", "legacy-tool"], path) == {
        "Some.Dist": "1.0", "legacy-tool": "0.3"}
    assert recorded_files(str(first / "Some_Dist-1.0.dist-info")) is None
