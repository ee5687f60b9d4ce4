"""Each distribution as a user gets it: its wheel and sdist, installed alone.

Every wheel and sdist carries the licence. Each wheel is installed into its own fresh
virtual environment with only its declared dependencies (edge-* ones from the wheels
built here, the rest from the registry; nothing installed by hand) and every module it
ships is imported. A module may fail to import only for a runtime that lives in the
route's interpreter or for a declared extra that was not asked for, and the failure
must name exactly that module. Where the backend runs here from its wheel alone (qnn on
the HTP simulator, the echo test backend), ``edge conformance`` passes in that venv. The
echo test backend, installed alone, shows in neither ``edge plugins`` nor ``edge probe``
unless ``EDGE_TEST_BACKENDS=1`` asks for it; edge-serve's wheel lists ``serve`` under its
distribution in ``edge --help``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from .distributions import DIRS, ROOT, project, wheel_name
from .test_declared_imports import PROVIDERS, ROUTE_RUNTIMES, requirement_name

pytestmark = pytest.mark.slow

IMPORT_ALL = textwrap.dedent('''
    import importlib, json, sys
    results = {}
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
            results[name] = None
        except ImportError as exc:
            results[name] = exc.name or str(exc)
    print(json.dumps(results))
''')


#: Distributions whose backend runs on this machine from the wheel and its declared
#: dependencies alone (ort-cpu needs its extra: the wheel smoke test in tests/wheels).
RUNS_HERE = {"plugins/backends/qnn": "qnn", "tests/edge_echo": "echo-preemptible"}


def _archive(built: Path, directory: str, suffix: str) -> Path:
    (path,) = built.glob(f"{wheel_name(directory)}-*{suffix}")
    return path


@pytest.mark.parametrize("directory", DIRS)
def test_wheel_and_sdist_carry_the_licence(built: Path, directory: str) -> None:
    licence = (ROOT / "LICENSE").read_bytes()
    with zipfile.ZipFile(_archive(built, directory, ".whl")) as wheel:
        (member,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert wheel.read(member) == licence
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        text = wheel.read(metadata).decode()
        assert "License-Expression: Apache-2.0" in text
        assert "Author: The edge-core maintainers" in text
        assert "Project-URL: Documentation, " in text
    sdist = _archive(built, directory, ".tar.gz")
    with tarfile.open(sdist) as archive:
        prefix = sdist.name.removesuffix(".tar.gz")
        handle = archive.extractfile(f"{prefix}/LICENSE")
        assert handle is not None and handle.read() == licence


def _modules(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") and ".dist-info" not in n]
    modules = []
    for name in names:
        parts = name.removesuffix(".py").split("/")
        if parts[-1] == "__main__":
            continue  # importing it runs the program
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    return sorted(modules)


def _allowed_missing(directory: str) -> set[str]:
    """Modules whose absence is fine: route runtimes and what only an extra brings."""
    allowed = {module for (d, module) in ROUTE_RUNTIMES if d == directory}
    extras = project(directory).get("optional-dependencies", {})
    for requirements in extras.values():
        for requirement in requirements:
            name = requirement_name(requirement)
            allowed |= {m for m, dists in PROVIDERS.items() if name in dists}
            allowed.add(name.replace("-", "_"))
    return allowed


@pytest.mark.parametrize("directory", DIRS)
def test_each_wheel_alone_in_a_fresh_venv_imports_every_module(
    built: Path, directory: str, tmp_path: Path,
) -> None:
    # The venv gets no pip of its own and nothing is byte-compiled as it installs (this
    # interpreter's pip installs into it through --python): what the wheel and its
    # dependencies put there, and so what its modules import, is the same, at a fraction
    # of the time (ensurepip and the compile were most of each venv's set-up).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    wheel = _archive(built, directory, ".whl")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-compile", "--find-links", str(built), str(wheel)],
        capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EDGE_PLUGINS"}}
    modules = _modules(wheel)
    assert modules
    run = subprocess.run([str(python), "-c", IMPORT_ALL, *modules], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = {m: missing for m, missing in json.loads(run.stdout).items() if missing}
    allowed = _allowed_missing(directory)
    unexpected = {m: missing for m, missing in failed.items()
                  if missing.split(".")[0] not in allowed}
    assert not unexpected, f"{directory}: {unexpected}"
    # Optional modules really are the exception: most of the wheel imported.
    assert len(failed) <= max(1, len(modules) // 4), failed
    edge = str(venv / "bin" / "edge")
    if directory == "tests/edge_echo":  # a test backend: hidden from a user's listing
        user_env = {k: v for k, v in env.items() if k != "EDGE_TEST_BACKENDS"}
        listing = subprocess.run([edge, "plugins", "--json"], cwd=tmp_path, env=user_env,
                                 capture_output=True, text=True, timeout=300, check=True)
        assert json.loads(listing.stdout)["plugins"] == [], listing.stdout
        probe = subprocess.run([edge, "probe", "--json"], cwd=tmp_path, env=user_env,
                               capture_output=True, text=True, timeout=300, check=True)
        assert json.loads(probe.stdout)["backends"] == [], probe.stdout
    if directory == "plugins/apps/serve":  # its command, listed under its distribution
        helped = subprocess.run([edge, "--help"], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=300, check=True)
        assert "from edge-serve 0.1.0:\n    serve " in helped.stdout, helped.stdout
    backend = RUNS_HERE.get(directory)
    if backend is not None:  # the backend runs here from its wheel alone: the whole kit
        kit = subprocess.run([edge, "conformance", backend, "--json"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600, check=False)
        assert kit.returncode == 0, kit.stdout[-3000:] + kit.stderr[-3000:]
        summary = json.loads(kit.stdout)["summary"]
        assert summary["failed"] == 0 and summary["passed"] > 0, summary
