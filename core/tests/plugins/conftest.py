from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .distributions import (
    BROKEN_PLUGIN,
    CRASHING_PROBE_PLUGIN,
    FUTURE_PLUGIN,
    GOOD_PLUGIN,
    make_plugin_distribution,
)


@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """A site directory holding a good, a broken, a future-contract and a crashing plugin."""
    site = tmp_path / "site"
    site.mkdir()
    make_plugin_distribution(site, "edge-toy", "toy", "edge_toy_plugin", GOOD_PLUGIN)
    make_plugin_distribution(site, "edge-broken", "broken", "edge_broken_plugin", BROKEN_PLUGIN)
    make_plugin_distribution(site, "edge-future", "future", "edge_future_plugin", FUTURE_PLUGIN)
    make_plugin_distribution(
        site, "edge-crashy", "crashy", "edge_crashy_plugin", CRASHING_PROBE_PLUGIN
    )
    return site


RunEdge = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_edge(plugin_site: Path) -> RunEdge:
    """Run the ``edge`` CLI in a subprocess that sees the temporary site directory."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # the session's probe-answer folder stays: no test writes to the user's cache
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith("EDGE_") or k == "EDGE_PROBE_CACHE"}
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(plugin_site), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", "import sys; from edge_core.cli import main; "
             "sys.exit(main())", *args],
            capture_output=True, text=True, env=full_env, timeout=60, check=False,
        )

    return run
