"""Which execution provider ran each node: from ORT's assignment info, else from profiling.

Worker side: imports only ``onnxruntime`` (passed in) and the standard library.

ONNX Runtime ≥ 1.24.1 records the node → provider assignment when the session option
``session.record_ep_graph_assignment_info`` is ``"1"`` and returns it from
``get_provider_graph_assignment_info()`` at no run-time cost. Older builds only expose it
through profiling: node events (``cat == "Node"``) carry ``args.provider``. Profiling is
switched on for the warm-up run only and ended right after it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["ASSIGNMENT_CONFIG_KEY", "from_assignment_info", "from_profile", "supports_assignment"]

ASSIGNMENT_CONFIG_KEY = "session.record_ep_graph_assignment_info"


def supports_assignment(session_class: Any) -> bool:
    """True when this ONNX Runtime build can report the assignment without profiling."""
    return hasattr(session_class, "get_provider_graph_assignment_info")


def _summary(nodes: Mapping[str, list[tuple[str, str]]]) -> dict[str, dict[str, Any]]:
    providers: dict[str, dict[str, Any]] = {}
    for provider, entries in nodes.items():
        op_types: dict[str, int] = {}
        for _, op in entries:
            op_types[op] = op_types.get(op, 0) + 1
        providers[provider] = {
            "nodes": len(entries),
            "op_types": op_types,
            "node_names": [name for name, _ in entries],
        }
    return providers


def from_assignment_info(session: Any) -> dict[str, dict[str, Any]]:
    """Provider → {nodes, op_types, node_names} from the session's recorded assignment."""
    nodes: dict[str, list[tuple[str, str]]] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        entries = nodes.setdefault(str(subgraph.ep_name), [])
        for node in subgraph.get_nodes():
            entries.append((str(node.name), str(node.op_type)))
    return _summary(nodes)


def from_profile(profile_path: str) -> dict[str, dict[str, Any]]:
    """Provider → {nodes, op_types, node_names} from a profiling file; the file is removed.

    A node that ran several times (loops) counts once per (name, provider).
    """
    try:
        with open(profile_path, encoding="utf-8") as handle:
            events = json.load(handle)
    finally:
        if profile_path and os.path.exists(profile_path):
            os.unlink(profile_path)
    seen: set[tuple[str, str]] = set()
    nodes: dict[str, list[tuple[str, str]]] = {}
    for event in events:
        if not isinstance(event, dict) or event.get("cat") != "Node":
            continue
        args = event.get("args") or {}
        provider = args.get("provider")
        if not provider:
            continue
        name = str(event.get("name", "")).removesuffix("_kernel_time")
        key = (name, str(provider))
        if key in seen:
            continue
        seen.add(key)
        nodes.setdefault(str(provider), []).append((name, str(args.get("op_name", "?"))))
    return _summary(nodes)
