"""Write the tiny ONNX graphs that edge-ort ships as package data.

edge-ort builds its conformance bundle and the ``add_relu`` test bundle from these files
at run time, so neither it nor any backend that builds on it needs the ``onnx`` package
installed. This tool, which does need ``onnx`` (a development requirement), is their
source: the graphs are spelled out below with ``onnx.helper``.

Usage::

    python plugins/libraries/ort/tools/make_graphs.py           # rewrite the graph files
    python plugins/libraries/ort/tools/make_graphs.py --check   # exit 1 if a file is stale
    python plugins/libraries/ort/tools/make_graphs.py --add-relu n,1024 OUT.onnx   # any shape
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src/edge_ort/graphs"


def add_relu(shape: tuple[int | str, ...] = (2, 3)) -> Any:
    """``y = relu(x + x)``, nodes ``add0`` and ``relu0``; a string dimension is symbolic."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("Add", ["x", "x"], ["t"], name="add0"),
             helper.make_node("Relu", ["t"], ["y"], name="relu0")]
    model = helper.make_model(helper.make_graph(nodes, "add_relu", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def loop_add_relu() -> Any:
    """``y = relu(loop_n(x) + loop_n(x))`` on ``[2, 3]``: the conformance kit's graph.

    The loop body passes ``x`` through unchanged, so ``y`` does not depend on ``n``; the
    cost grows with ``n``, which lets the kit cancel a request while it runs.
    """
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Identity", ["v_in"], ["v_out"], name="pass_through")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 3])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["v"], name="spin", body=body),
         helper.make_node("Add", ["v", "v"], ["t"], name="double"),
         helper.make_node("Relu", ["t"], ["y"], name="relu")],
        "conformance",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


GRAPHS = {"add_relu.onnx": add_relu,
          "add_relu_n3.onnx": lambda: add_relu(("n", 3)),
          "loop_add_relu.onnx": loop_add_relu}


def serialise(model: Any) -> bytes:
    """The model's bytes, checked by ``onnx.checker`` first."""
    import onnx

    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def main(argv: list[str] | None = None) -> int:
    """Write (or ``--check``) every graph file; ``--add-relu SHAPE OUT`` writes one graph."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--add-relu", nargs=2, metavar=("SHAPE", "OUT"),
                        help="write add_relu with SHAPE (comma-separated, names symbolic)")
    args = parser.parse_args(argv)
    if args.add_relu:
        shape = tuple(int(d) if d.isdigit() else d for d in args.add_relu[0].split(","))
        Path(args.add_relu[1]).write_bytes(serialise(add_relu(shape)))
        return 0
    stale = []
    for name, build in GRAPHS.items():
        data = serialise(build())
        path = OUT / name
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if stale:
        print(f"stale graph files in {OUT}: {', '.join(stale)}; rerun {Path(__file__).name}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
