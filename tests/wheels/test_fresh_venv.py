"""The wheel smoke test: the distributions as users get them, in a fresh virtual env.

Builds the wheels of edge-contracts, edge-core, edge-ort, edge-ort-cpu and the OCR
example, and installs ``edge-core`` and ``edge-ort-cpu[onnxruntime]`` from them into a new
venv outside the checkout with nothing installed by hand (their other dependencies come
from the registry). Then, from a directory outside the checkout:

* an ort-cpu stage serves twenty sequential requests, each output equal to a direct
  onnxruntime run, and nothing stays reserved after shutdown;
* ``edge plugins`` lists exactly ``ort-cpu``, and ``edge conformance ort-cpu`` passes every
  check (none skipped, none failed);
* with the OCR example's wheel added, ``edge run`` serves its three-stage pipeline on one
  rendered page and recognises the page's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTS = ["contracts", "core", "plugins/libraries/ort", "plugins/backends/ort_cpu", "examples/ocr"]

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import numpy as np
    import onnxruntime as ort
    import edge_core
    from edge_core.config import load_pipeline
    from edge_core.ledger import ResourceLedger
    from edge_core.plugins import load_plugins
    from edge_core.pools import probe_host
    from edge_core.runtime import Pipeline
    from edge_ort.bundles import write_add_relu_bundle

    bundle = write_add_relu_bundle(Path(sys.argv[1]) / "bundle")
    config = load_pipeline({"name": "wheel", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    ledger = ResourceLedger.from_topology(probe_host().topology())
    direct = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    exact = 0
    with Pipeline.open(config, load_plugins(), ledger) as pipeline:
        for _ in range(20):
            value = rng.standard_normal((2, 3)).astype(np.float32)
            with pipeline.run({"x": value}) as result:
                exact += bool(np.array_equal(result.outputs["y"],
                                             direct.run(["y"], {"x": value})[0]))
        plan = pipeline.execution_plan()
    print(json.dumps({"exact": exact, "empty": ledger.is_empty(),
                      "edge_core": str(Path(edge_core.__file__).parent),
                      "providers": plan["stages"][0]["placement"]["providers"]}))
''')


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding edge-core and edge-ort-cpu[onnxruntime] from built wheels."""
    base = tmp_path_factory.mktemp("wheels")
    wheels = base / "wheels"
    for dist in DISTS:
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                        "--outdir", str(wheels), str(ROOT / dist)],
                       check=True, capture_output=True, timeout=300)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (core,) = wheels.glob("edge_core-*.whl")
    (ort_cpu,) = wheels.glob("edge_ort_cpu-*.whl")
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--find-links", str(wheels),
         str(core), f"{ort_cpu}[onnxruntime]"],
        capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return venv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EDGE_PLUGINS"}}


def test_wheels_serve_twenty_exact_requests_and_pass_conformance(
    venv: Path, tmp_path: Path,
) -> None:
    work = tmp_path / "outside"
    work.mkdir()
    result = subprocess.run([str(venv / "bin/python"), "-c", SCRIPT, str(work)], cwd=work,
                            env=_env(), capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["exact"] == 20
    assert report["empty"] is True
    assert report["edge_core"].startswith(str(venv))  # the wheel, not the checkout
    assert report["providers"]["CPUExecutionProvider"]["nodes"] == 2
    edge = str(venv / "bin/edge")
    listing = subprocess.run([edge, "plugins", "--json"], cwd=work, env=_env(),
                             capture_output=True, text=True, timeout=60, check=True)
    assert [row["name"] for row in json.loads(listing.stdout)["plugins"]] == ["ort-cpu"]
    kit = subprocess.run([edge, "conformance", "ort-cpu", "--json"], cwd=work, env=_env(),
                         capture_output=True, text=True, timeout=600, check=False)
    assert kit.returncode == 0, kit.stdout[-3000:] + kit.stderr[-3000:]
    summary = json.loads(kit.stdout)["summary"]
    assert summary["failed"] == 0 and summary["skipped"] == 0 and summary["passed"] >= 13


def test_wheels_run_the_ocr_pipeline_on_one_page(venv: Path, tmp_path: Path) -> None:
    from edge_ocr_example.models import fetch_wheel

    python = venv / "bin/python"
    wheels = next(venv.parent.glob("wheels"))
    (example,) = wheels.glob("edge_ocr_example-*.whl")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--find-links",
                    str(wheels), str(example)], check=True, capture_output=True, timeout=600)
    out = tmp_path / "ocr"
    build = subprocess.run([str(venv / "bin/edge-ocr-bundles"), str(out), "--wheel",
                            str(fetch_wheel())], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    expected = json.loads((out / "bundle.json").read_text())["example_text"]
    run = subprocess.run([str(venv / "bin/edge"), "run", str(out / "pipeline.toml"),
                          "--input", str(out / "image.png"), "--json"], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads(run.stdout)
    assert document["ok"] is True
    assert expected and all(line in json.dumps(document) for line in expected)
