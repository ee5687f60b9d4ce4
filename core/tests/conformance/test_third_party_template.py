"""The template as a third party ships it: a wheel in a fresh venv beside edge-core's wheels.

Builds the edge-contracts, edge-core and examples/third_party_backend wheels, installs
them (dependencies and pytest from the registry) into a new virtual environment outside
the checkout, then from a directory outside the checkout: ``edge plugins`` lists the
backend, ``edge conformance`` passes every check, and the kit's pytest plugin (found
through edge-core's ``pytest11`` entry point in the wheel) runs the same checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_core.testing.checks import CHECKS

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "examples" / "third_party_backend"
DISTS = [ROOT / "contracts", ROOT / "core", TEMPLATE]


@pytest.mark.slow
def test_the_template_wheel_is_listed_and_passes_the_kit_in_a_fresh_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for dist in DISTS:
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                        "--outdir", str(wheels), str(dist)],
                       check=True, capture_output=True, timeout=300)
    built = sorted(str(w) for w in wheels.glob("*.whl"))
    assert [Path(w).name.split("-")[0] for w in built] == [
        "edge_contracts", "edge_core", "edge_example_backend"]
    venv = tmp_path / "venv"
    # no pip of its own, nothing byte-compiled at install: the same packages, in less time
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--no-compile", *built, "pytest"], check=True,
                   capture_output=True, timeout=600)
    outside = tmp_path / "outside"
    shutil.copytree(TEMPLATE / "tests", outside / "tests")
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "EDGE_PLUGINS", "VIRTUAL_ENV"}}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=outside, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    listing = run("edge", "plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [p["name"] for p in json.loads(listing.stdout)["plugins"]] == ["example-numpy"]

    kit = run("edge", "conformance", "example-numpy", "--json")
    assert kit.returncode == 0, kit.stdout[-3000:] + kit.stderr[-3000:]
    report = json.loads(kit.stdout)
    assert report["summary"] == {"passed": len(CHECKS), "failed": 0, "skipped": 0}

    own = run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
    assert own.returncode == 0, own.stdout[-3000:]
    written = sum(text.count("\ndef test_") for text in (
        path.read_text(encoding="utf-8") for path in (TEMPLATE / "tests").glob("test_*.py")))
    assert written and f"{written} passed" in own.stdout  # every test it ships ran and passed
    via_plugin = run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--edge-backend", "example-numpy", "-k", "conformance[")
    assert via_plugin.returncode == 0, via_plugin.stdout[-3000:]
    assert f"{len(CHECKS)} passed" in via_plugin.stdout
