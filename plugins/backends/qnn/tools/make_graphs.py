"""Write the ONNX graph that edge-qnn ships as package data for its conformance stage.

A static float32 ``Conv(3→4, 3x3, pads 1) → Relu`` on ``[1, 3, 8, 8]`` with fixed weights
(seed 3), which QNN places whole. edge-qnn reads the file at run time, so it does not need
the ``onnx`` package; this tool (which does, a development requirement) is its source.

Usage::

    python plugins/backends/qnn/tools/make_graphs.py           # rewrite the graph file
    python plugins/backends/qnn/tools/make_graphs.py --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "src/edge_qnn/graphs/conv_relu.onnx"


def conv_relu() -> Any:
    """The graph, its weight ``w`` an initializer drawn with seed 3."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        "conformance",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    """Write the graph file, or with ``--check`` exit 1 when it differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    data: bytes = conv_relu().SerializeToString()
    if args.check:
        if not OUT.is_file() or OUT.read_bytes() != data:
            print(f"{OUT} is stale; rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
