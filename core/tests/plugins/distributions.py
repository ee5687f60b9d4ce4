"""Build real (unpacked) distributions with ``edge`` entry points in a temporary site dir."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_plugin_distribution(
    site: Path, dist: str, entry_name: str, module: str, source: str, version: str = "0.1.0"
) -> None:
    """Write ``module.py`` and a ``.dist-info`` whose entry point registers it as a plugin."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    )
    (info / "entry_points.txt").write_text(f"[edge]\n{entry_name} = {module}\n")
    (info / "RECORD").write_text("")


GOOD_PLUGIN = """
    from edge_core import hookimpl
    from edge_core.backend import BackendInfo, ProbeReport

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends():
        return [BackendInfo(name="toy", kinds=["graph"])]

    @hookimpl
    def edge_probe():
        return [ProbeReport(backend="toy", available=True)]
"""

BROKEN_PLUGIN = """
    raise ImportError("this plugin's runtime is missing")
"""

FUTURE_PLUGIN = """
    from edge_core import hookimpl

    EDGE_CONTRACT = "2.0"

    @hookimpl
    def edge_probe():
        return []
"""

CRASHING_PROBE_PLUGIN = """
    from edge_core import hookimpl
    from edge_core.backend import BackendInfo

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends():
        return [BackendInfo(name="crashy", kinds=["graph"])]

    @hookimpl
    def edge_probe():
        raise RuntimeError("driver exploded")
"""
