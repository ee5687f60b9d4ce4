"""The distributions as users get them: built wheels in a fresh virtual environment.

Builds edge-contracts, edge-core and edge-ort-cpu wheels, installs them (with onnxruntime
from the registry) into a new venv outside the checkout, and runs an ort-cpu stage for
twenty sequential requests from a directory outside the checkout: every output equals a
direct onnxruntime run exactly, and nothing stays reserved after shutdown.
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
DISTS = ["contracts", "core", "plugins/ort", "plugins/ort_cpu"]

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    import edge_core
    from edge_core.artifacts import create_manifest
    from edge_core.config import load_pipeline
    from edge_core.ledger import ResourceLedger
    from edge_core.plugins import load_plugins
    from edge_core.pools import probe_host
    from edge_core.runtime import Pipeline

    work = Path(sys.argv[1])
    bundle = work / "bundle"
    bundle.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    nodes = [helper.make_node("Mul", ["x", "x"], ["t"], name="mul0"),
             helper.make_node("Tanh", ["t"], ["y"], name="tanh0")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(bundle / "model.onnx"))
    example = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.savez(bundle / "example.npz", x=example)
    np.savez(bundle / "expected.npz", y=np.tanh(example * example))
    create_manifest(bundle, example_inputs="example.npz", expected_outputs="expected.npz")
    config = load_pipeline({"name": "wheel", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    ledger = ResourceLedger.from_topology(probe_host().topology())
    direct = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    exact = 0
    with Pipeline.open(config, load_plugins(), ledger) as pipeline:
        for _ in range(20):
            value = rng.standard_normal((4, 8)).astype(np.float32)
            with pipeline.run({"x": value}) as result:
                exact += bool(np.array_equal(result.outputs["y"],
                                             direct.run(["y"], {"x": value})[0]))
        plan = pipeline.execution_plan()
    print(json.dumps({"exact": exact, "empty": ledger.is_empty(),
                      "edge_core": str(Path(edge_core.__file__).parent),
                      "providers": plan["stages"][0]["placement"]["providers"]}))
''')


@pytest.mark.slow
def test_wheels_in_a_fresh_venv_serve_twenty_exact_requests(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for dist in DISTS:
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                        "--outdir", str(wheels), str(ROOT / dist)],
                       check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    built = sorted(str(w) for w in wheels.glob("*.whl"))
    assert len(built) == len(DISTS), built
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *built, "onnxruntime",
                    "onnx"], check=True, capture_output=True, timeout=600)
    work = tmp_path / "outside"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EDGE_PLUGINS"}}
    result = subprocess.run([str(python), "-c", SCRIPT, str(work)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["exact"] == 20
    assert report["empty"] is True
    assert report["edge_core"].startswith(str(venv))  # the wheel, not the checkout
    assert report["providers"]["CPUExecutionProvider"]["nodes"] == 2
    listing = subprocess.run([str(venv / "bin" / "edge"), "plugins", "--json"], cwd=work,
                             env=env, capture_output=True, text=True, timeout=60, check=True)
    names = [row["name"] for row in json.loads(listing.stdout)["plugins"]]
    assert names == ["ort-cpu"]
