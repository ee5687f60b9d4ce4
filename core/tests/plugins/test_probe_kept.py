"""``edge probe`` (and ``edge plugins``) reuse their kept answer only while nothing it was
made from has moved.

Real ``edge`` processes over a site folder of real plugin distributions: the first probe
asks every plugin and keeps the answer; the next one gives it back, noting when it was
kept, until a plugin's code, the plugin set or the environment changes, ``--fresh`` asks,
or a plugin failed (an answer with a failure is never kept).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .distributions import GOOD_PLUGIN

KEPT = "probe answer kept since "

Probe = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def probe(plugin_site: Path, tmp_path: Path) -> Probe:
    """``edge probe ARGS`` in a fresh process: its own answer folder, an unchanging cwd.

    No bytecode is written, so the site folder is not changed by the first import (a
    ``__pycache__`` made there would rightly count as a change of the path).
    """
    cache = tmp_path / "answers"
    cache.mkdir()
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
        full_env.update({"PYTHONPATH": str(plugin_site), "EDGE_PROBE_CACHE": str(cache),
                         "PYTHONDONTWRITEBYTECODE": "1", "EDGE_PLUGINS": "toy"})
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", "import sys; from edge_core.cli import main; "
             "sys.exit(main())", "probe", *args],
            capture_output=True, text=True, env=full_env, cwd=work, timeout=120, check=False)

    return run


def _notes(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["backends"]
    notes: list[str] = row["notes"]
    return notes


def _without_kept_notes(stdout: str) -> dict[str, object]:
    body: dict[str, object] = json.loads(stdout)
    for row in body["backends"]:  # type: ignore[attr-defined]
        row["notes"] = [n for n in row["notes"] if not n.startswith(KEPT)]
    return body


def test_the_kept_answer_is_the_live_one_until_the_plugins_code_changes(
        probe: Probe, plugin_site: Path) -> None:
    live = probe("--json")
    assert not any(n.startswith(KEPT) for n in _notes(live))
    kept = probe("--json")
    assert [n for n in _notes(kept) if n.startswith(KEPT)], kept.stdout
    assert _without_kept_notes(kept.stdout) == json.loads(live.stdout)
    human = probe()
    assert "toy  [toy]  available" in human.stdout
    assert human.stdout.count(KEPT) == 1 and f"note: {KEPT}" not in human.stdout  # said once
    module = plugin_site / "edge_toy_plugin.py"
    module.write_text(module.read_text().replace(
        'ProbeReport(backend="toy", available=True)',
        'ProbeReport(backend="toy", available=True, notes=["driver 2"])'))
    changed = probe("--json")
    assert _notes(changed) == ["driver 2"]  # asked again: the new code's answer
    assert [n for n in _notes(probe("--json")) if not n.startswith(KEPT)] == ["driver 2"]


def test_fresh_another_environment_and_another_plugin_set_ask_again(
        probe: Probe, plugin_site: Path) -> None:
    probe("--json")
    assert any(n.startswith(KEPT) for n in _notes(probe("--json")))
    assert _notes(probe("--json", "--fresh")) == []
    assert _notes(probe("--json", env={"EDGE_QNN_PYTHON": "/opt/qnn/bin/python"})) == []
    assert _notes(probe("--json", env={"EDGE_TRACE_HOOKS": "1"})) == []
    from .distributions import make_plugin_distribution

    make_plugin_distribution(plugin_site, "edge-toy-two", "toy2", "edge_toy_two_plugin",
                             GOOD_PLUGIN.replace('"toy"', '"toy2"'))
    both = probe("--json", env={"EDGE_PLUGINS": "toy,toy2"})
    assert both.returncode == 0, both.stderr
    rows = json.loads(both.stdout)["backends"]
    assert [row["backend"] for row in rows] == ["toy", "toy2"]
    assert not any(n.startswith(KEPT) for row in rows for n in row["notes"])


def test_an_answer_with_a_failed_plugin_is_never_kept(probe: Probe) -> None:
    for _ in range(2):
        result = probe("--json", env={"EDGE_PLUGINS": "toy,crashy"})
        assert result.returncode == 0, result.stderr
        body = json.loads(result.stdout)
        assert {"plugin": "crashy", "error": "RuntimeError: driver exploded",
                "named_by": "EDGE_PLUGINS"} in body["plugin_errors"]
        assert not any(n.startswith(KEPT) for row in body["backends"] for n in row["notes"])
    for _ in range(2):  # strict mode still fails on every run
        strict = probe("--json", env={"EDGE_PLUGINS": "toy,broken", "EDGE_STRICT_PLUGINS": "1"})
        assert strict.returncode == 3, strict.stdout


def test_the_kept_plugin_listing_is_the_live_one_until_a_plugin_changes(
        probe: Probe, plugin_site: Path) -> None:
    # the probe fixture made the answer folder and the still working directory used here
    def listing(*extra: str, env: dict[str, str] | None = None) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from edge_core.cli import main; "
             "sys.exit(main())", "plugins", "--json", *extra],
            capture_output=True, text=True, timeout=120, check=False,
            cwd=plugin_site.parent / "work",
            env={**{k: v for k, v in os.environ.items() if not k.startswith("EDGE_")},
                 "PYTHONPATH": str(plugin_site), "PYTHONDONTWRITEBYTECODE": "1",
                 "EDGE_PROBE_CACHE": str(plugin_site.parent / "answers"), **(env or {})})
        assert done.returncode == (3 if env and "EDGE_STRICT_PLUGINS" in env else 0), done.stderr
        body: dict[str, object] = json.loads(done.stdout)
        return body

    allow = {"EDGE_PLUGINS": "toy"}
    live = listing(env=allow)
    assert listing(env=allow) == live  # given back as it was listed
    (row,) = live["plugins"]  # type: ignore[misc]
    assert row["hooks"] == ["edge_backends", "edge_probe"]
    module = plugin_site / "edge_toy_plugin.py"
    module.write_text(module.read_text() + "\n@hookimpl\ndef edge_cancel(loaded, request_id, "
                      "epoch):\n    return None\n")
    (changed,) = listing(env=allow)["plugins"]  # type: ignore[misc]
    assert changed["hooks"] == ["edge_backends", "edge_cancel", "edge_probe"]
    for _ in range(2):  # a listing with a broken plugin is found again on every run
        rows = {r["name"]: r for r in listing(env={"EDGE_PLUGINS": "toy,broken"})["plugins"]}  # type: ignore[attr-defined]
        assert "import failed" in rows["broken"]["error"]
        listing(env={"EDGE_PLUGINS": "toy,broken", "EDGE_STRICT_PLUGINS": "1"})
