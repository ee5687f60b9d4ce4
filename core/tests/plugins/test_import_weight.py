"""The controller stays light: listing and probing plugins imports no heavy runtime.

``edge plugins`` imports the plugin modules but none of the plugin machinery; a kept
``edge probe`` answer (:mod:`edge_core.host.probe_answers`) imports no plugin at all. What
each process imported is read from its ``sys.modules`` at the end: no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numpy", "onnxruntime", "torch", "vllm", "qai_hub", "onnx")

SCRIPT = """
import contextlib, io, json, sys
from edge_core.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize(
    "argv",
    [["plugins", "--json"], ["plugins", "--json", "--backends"], ["probe", "--json"]],
)
def test_cli_commands_import_no_heavy_runtime(argv: list[str]) -> None:
    # the live probe: no kept answer
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=60,
        check=True, env={**os.environ, "EDGE_PROBE_CACHE": "off"},
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    loaded = {name.split(".")[0] for name in report["modules"]}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    # The in-tree plugins really were imported (the check would be empty otherwise).
    assert "edge_ort_cpu" in loaded


MACHINERY = {"pluggy", "attrs", "attr", "cattrs", "psutil", "onnxruntime", "numpy",
             "importlib.metadata", "pathlib", "subprocess", "edge_contracts"}
"""What a plain listing or a kept probe answer has no need of (top-level names, and the
two standard modules that cost most: the metadata parser and the path classes)."""

KEPT_MACHINERY = MACHINERY | {"typing"}
"""What a kept answer has no need of either: ``typing`` too, the costliest standard module
the CLI would import (the plugin modules a live answer imports may use it)."""


def _imported(modules: list[str]) -> set[str]:
    return {name.split(".")[0] for name in modules} | set(modules)


def test_plain_plugin_listing_imports_none_of_the_plugin_machinery() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "plugins", "--json"], capture_output=True, text=True,
        timeout=60, check=True,
    )
    loaded = _imported(json.loads(result.stdout)["modules"])
    assert not loaded & MACHINERY, sorted(loaded & MACHINERY)
    assert {"edge_qnn", "edge_ort_cpu", "edge_vllm_cuda"} <= loaded  # still imported: listed


def test_a_kept_probe_answer_imports_no_plugin(tmp_path: Path) -> None:
    cache = tmp_path / "answers"
    cache.mkdir()
    work = tmp_path / "work"  # the working directory is on sys.path under -c: keep it still
    work.mkdir()
    env = {**os.environ, "EDGE_PROBE_CACHE": str(cache)}
    reports = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", SCRIPT, "probe", "--json"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=120, check=True)
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    live, kept = (_imported(report["modules"]) for report in reports)
    assert {"pluggy", "edge_ort_cpu", "edge_qnn"} <= live  # the first asked every plugin
    assert reports[1]["code"] == 0
    plugins = {name.split(".")[0] for name in kept if name.startswith("edge_")} - {"edge_core"}
    assert not kept & KEPT_MACHINERY and not plugins, sorted((kept & KEPT_MACHINERY) | plugins)


def test_a_kept_plugin_listing_imports_no_plugin(tmp_path: Path) -> None:
    cache = tmp_path / "answers"
    cache.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "EDGE_PROBE_CACHE": str(cache)}
    reports = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", SCRIPT, "plugins", "--json"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=120, check=True)
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    live, kept = (_imported(report["modules"]) for report in reports)
    assert {"edge_ort_cpu", "edge_qnn", "edge_core.hookspecs"} <= live
    plugins = {name.split(".")[0] for name in kept if name.startswith("edge_")} - {"edge_core"}
    assert not plugins and "edge_core.hookspecs" not in kept, sorted(plugins)
    assert not kept & KEPT_MACHINERY, sorted(kept & KEPT_MACHINERY)


WORKER_UNNEEDED = {"statistics", "fractions", "decimal", "random", "pathlib", "urllib.parse",
                   "ipaddress", "hashlib", "_hashlib", "edge_contracts.error_details",
                   "edge_contracts.request_faults"}
"""What an ort-cpu worker has no need of until its stage is open: the spin rule's median
(:mod:`statistics` brings fractions, decimal and random), the huge-page size file's path
(:mod:`pathlib`), OpenSSL's sha256 for a small example archive (:mod:`hashlib`), what
reads an error's fault and detail (no error was reported)."""

WORKER_NEEDED = {"edge_contracts.worker", "edge_contracts.wire", "numpy", "onnxruntime",
                 "edge_ort.npz"}
"""What it does import (the log would be empty otherwise: the check would pass on nothing)."""


def test_an_ort_cpu_worker_opens_without_modules_it_has_no_need_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real worker of a stage, its imports read from its own ``-X importtime`` log.

    The route sets ``PYTHONPROFILEIMPORTTIME`` (a route's ``env`` is set as given), and
    the worker's stderr goes to its log file: every module it imported until the stage
    was open (hello, load, warm-up gate) is named there.
    """
    from edge_core.config import load_pipeline
    from edge_core.host.worker_logs import LOG_DIR_ENV
    from edge_core.ledger import ResourceLedger
    from edge_core.plugins import load_plugins
    from edge_core.pools import Pool
    from edge_core.runtime import Pipeline
    from edge_ort.bundles import write_add_relu_bundle

    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path / "logs"))
    # spawned: a worker forked by the warm pool imported what its zygote had imported
    # (edge_contracts.worker, numpy) in the zygote, whose trace is not in this log
    monkeypatch.setenv("EDGE_WARM_POOL", "0")
    bundle = write_add_relu_bundle(tmp_path / "add_relu")
    route = {"name": "traced", "interpreter": sys.executable,
             "env": {"PYTHONPROFILEIMPORTTIME": "1"}}
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "route": route}, "manifest": str(bundle)}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    with Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}),
                       ledger) as pipeline:
        log = pipeline.stages[0].loaded.log_path  # type: ignore[attr-defined]
        assert log is not None
        imported = {line.rsplit("|", 1)[1].strip()
                    for line in log.read_text(encoding="utf-8").splitlines()
                    if line.startswith("import time:") and line.count("|") == 2}
    assert ledger.is_empty()
    assert imported >= WORKER_NEEDED, sorted(WORKER_NEEDED - imported)
    assert not imported & WORKER_UNNEEDED, sorted(imported & WORKER_UNNEEDED)


def test_a_supervisor_starts_from_bytecode_without_the_signal_enums() -> None:
    """The supervisor, which every worker waits for, imports its module (cached bytecode,
    not a script compiled at each start) and the C signal module (no enum machinery)."""
    from edge_core.host.supervisor import supervisor_argv

    argv = supervisor_argv([sys.executable, "-c", "pass"], controller=os.getpid(),
                           prefixes=[], remove=[])
    assert argv[0] == sys.executable and argv[1:3] == ["-I", "-S"]
    assert any(arg.endswith("supervisor.py") for arg in argv)  # where tools look for it
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                          text=True, timeout=60, check=True)
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:") and line.count("|") == 2}
    assert "supervisor" in imported, sorted(imported)
    assert not imported & {"signal", "enum", "functools"}, sorted(imported)
