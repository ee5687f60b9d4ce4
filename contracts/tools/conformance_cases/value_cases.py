"""Cases of the contract value types: buffers, requests, events, errors, state, devices, artifacts.

Valid objects are plain JSON data; invalid ones are named overrides (RFC 6901 JSON
pointers) of a valid object with the error class and field they must produce. The state
handle's stale and accepted variants (``STALE``, ``ACCEPTED``) are here too.
"""

from __future__ import annotations

import json
from typing import Any

from .common import SHA_A, SHA_B, case

BUFFER = {"owner": "ort-cpu.w1", "generation": 3, "dtype": "float32", "shape": [2, 3, 4],
          "nbytes": 96, "domain": "host", "layout": "C", "ready": True}
BUFFERS = {
    "valid": [BUFFER,
              {**BUFFER, "dtype": "bfloat16", "shape": [], "nbytes": 2, "ready": False},
              {**BUFFER, "dtype": "bool", "shape": [0, 5], "nbytes": 0}],
    "invalid": [
        case("nbytes off by one", "InvalidValue", "buffer.nbytes", {"/nbytes": 97}),
        case("nbytes off by one below", "InvalidValue", "buffer.nbytes", {"/nbytes": 95}),
        case("negative dimension", "InvalidValue", "buffer.shape[1]", {"/shape": [2, -3, 4]}),
        case("33 dimensions", "InvalidValue", "buffer.shape", {"/shape": [1] * 33, "/nbytes": 4}),
        case("boolean dimension", "InvalidValue", "buffer.shape[0]",
             {"/shape": [True, 3, 4], "/nbytes": 48}),
        case("fractional dimension", "InvalidValue", "buffer.shape[0]", {"/shape": [2.5, 3, 4]}),
        case("shape is not an array", "InvalidValue", "buffer.shape", {"/shape": "2x3x4"}),
        case("unknown dtype", "InvalidValue", "buffer.dtype", {"/dtype": "float"}),
        case("dtype alias", "InvalidValue", "buffer.dtype", {"/dtype": "bf16"}),
        case("dtype wrong case", "InvalidValue", "buffer.dtype", {"/dtype": "Float32"}),
        case("unknown memory domain", "InvalidValue", "buffer.domain", {"/domain": "cuda"}),
        case("unknown layout", "InvalidValue", "buffer.layout", {"/layout": "F"}),
        case("negative generation", "InvalidValue", "buffer.generation", {"/generation": -1}),
        case("boolean generation", "InvalidValue", "buffer.generation", {"/generation": True}),
        case("generation beyond int64", "InvalidValue", "buffer.generation",
             {"/generation": 2**63}),
        case("empty owner", "InvalidValue", "buffer.owner", {"/owner": ""}),
        case("owner of 129 characters", "InvalidValue", "buffer.owner", {"/owner": "o" * 129}),
        case("nbytes as a string", "InvalidValue", "buffer.nbytes", {"/nbytes": "96"}),
        case("ready as a string", "InvalidValue", "buffer.ready", {"/ready": "yes"}),
        case("missing nbytes", "InvalidValue", "buffer.nbytes", delete=["/nbytes"]),
        case("unknown key", "InvalidValue", "buffer.device", {"/device": "gpu0"}),
    ],
}

REQUEST = {"request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
           "operation": "run", "inputs": [BUFFER],
           "params": {"threshold": 0.25, "labels": ["a", "b"], "nested": {"k": None}},
           "deadline_ns": 123456789}
REQUESTS = {
    "valid": [REQUEST,
              {**REQUEST, "request_id": "chat 7/turn 2", "operation": "generate", "inputs": [],
               "params": {}, "deadline_ns": None}],
    "invalid": [
        case("empty request id", "InvalidValue", "request.request_id", {"/request_id": ""}),
        case("request id of 129 characters", "InvalidValue", "request.request_id",
             {"/request_id": "r" * 129}),
        case("request id with a newline", "InvalidValue", "request.request_id",
             {"/request_id": "a\nb"}),
        case("empty stage id", "InvalidValue", "request.stage_id", {"/stage_id": ""}),
        case("negative epoch", "InvalidValue", "request.epoch", {"/epoch": -1}),
        case("boolean epoch", "InvalidValue", "request.epoch", {"/epoch": False}),
        case("epoch beyond int64", "InvalidValue", "request.epoch", {"/epoch": 2**63}),
        case("negative generation", "InvalidValue", "request.generation", {"/generation": -2}),
        case("unknown operation", "InvalidValue", "request.operation", {"/operation": "train"}),
        case("input nbytes off by one", "InvalidValue", "request.inputs[0].nbytes",
             {"/inputs/0/nbytes": 95}),
        case("input of unknown domain", "InvalidValue", "request.inputs[0].domain",
             {"/inputs/0/domain": "vram"}),
        case("input that is not ready", "InvalidValue", "request.inputs[0].ready",
             {"/inputs/0/ready": False}),
        case("params not an object", "InvalidValue", "request.params", {"/params": [1, 2]}),
        case("negative deadline", "InvalidValue", "request.deadline_ns", {"/deadline_ns": -1}),
        case("missing operation", "InvalidValue", "request.operation", delete=["/operation"]),
        case("unknown key", "InvalidValue", "request.priority", {"/priority": 1}),
    ],
}

ERROR = {"type": "RuntimeError", "message": "kernel failed"}
EVENT = {"request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
         "seq": 0, "kind": "output", "terminal": False, "error": None, "outputs": [BUFFER],
         "data": {"boxes": 3}, "created_ns": 1000}
EVENTS = {
    "valid": [EVENT,
              {**EVENT, "seq": 1, "kind": "token", "outputs": [], "data": {"text": "hé"}},
              {**EVENT, "seq": 2, "kind": "progress", "outputs": [], "data": {}},
              {**EVENT, "seq": 3, "kind": "done", "terminal": True},
              {**EVENT, "seq": 4, "kind": "error", "terminal": True, "error": ERROR,
               "outputs": [], "data": {}},
              {**EVENT, "seq": 5, "kind": "cancelled", "terminal": True, "outputs": [],
               "data": {}}],
    "invalid": [
        case("done that is not terminal", "InvalidValue", "event.terminal",
             {"/kind": "done"}),
        case("token that is terminal", "InvalidValue", "event.terminal",
             {"/kind": "token", "/terminal": True}),
        case("error without error info", "InvalidValue", "event.error",
             {"/outputs": [], "/error": None}, base=4),
        case("error info on a done event", "InvalidValue", "event.error", {"/error": ERROR},
             base=3),
        case("outputs on a cancelled event", "InvalidValue", "event.outputs",
             {"/outputs": [BUFFER]}, base=5),
        case("outputs on an error event", "InvalidValue", "event.outputs",
             {"/outputs": [BUFFER]}, base=4),
        case("unknown kind", "InvalidValue", "event.kind", {"/kind": "finished"}),
        case("negative seq", "InvalidValue", "event.seq", {"/seq": -1}),
        case("empty error type", "InvalidValue", "event.error.type", {"/error/type": ""},
             base=4),
        case("error message over 8192 characters", "InvalidValue", "event.error.message",
             {"/error/message": "m" * 8193}, base=4),
        case("output nbytes off by one", "InvalidValue", "event.outputs[0].nbytes",
             {"/outputs/0/nbytes": 97}),
        case("data not an object", "InvalidValue", "event.data", {"/data": "text"}),
        case("negative created_ns", "InvalidValue", "event.created_ns", {"/created_ns": -5}),
        case("missing terminal", "InvalidValue", "event.terminal", delete=["/terminal"]),
    ],
}
FAULT = {"type": "ContextLengthExceeded", "message": "params.max_tokens: exceeds the context",
         "fault": {"code": "context_length_exceeded", "param": "max_tokens"}}
DETAIL = {"type": "ArchiveChanged",
          "message": "/b/x.npz: differs from the manifest's sha256; sha256 now: '9f00'",
          "detail": {"field": "/b/x.npz", "reason": "differs from the manifest's sha256; "
                     "sha256 now", "value": "9f00"}}
ERRORS = {
    "valid": [ERROR, {"type": "edge.Cancelled", "message": ""}, FAULT,
              {**FAULT, "fault": {"code": "invalid_value", "param": None}}, DETAIL,
              {**DETAIL, "detail": {"field": "shape[0]", "reason": "", "value": None}},
              {**DETAIL, "detail": {"field": "nbytes", "reason": "must be >= 0",
                                    "value": -1}}],
    "invalid": [
        case("empty type", "InvalidValue", "error.type", {"/type": ""}),
        case("message not a string", "InvalidValue", "error.message", {"/message": 7}),
        case("missing message", "InvalidValue", "error.message", delete=["/message"]),
        case("fault code not a word", "InvalidValue", "error.fault.code",
             {"/fault/code": "Bad Code"}, base=2),
        case("fault without a code", "InvalidValue", "error.fault.code",
             delete=["/fault/code"], base=2),
        case("fault param empty", "InvalidValue", "error.fault.param", {"/fault/param": ""},
             base=2),
        case("fault with an unknown key", "InvalidValue", "error.fault.why",
             {"/fault/why": "x"}, base=2),
        case("detail field empty", "InvalidValue", "error.detail.field",
             {"/detail/field": ""}, base=4),
        case("detail value not a scalar", "InvalidValue", "error.detail.value",
             {"/detail/value": {"sha256": "9f00"}}, base=4),
        case("detail without a value", "InvalidValue", "error.detail.value",
             delete=["/detail/value"], base=4),
        case("detail with an unknown key", "InvalidValue", "error.detail.why",
             {"/detail/why": "x"}, base=4),
    ],
}

STATE = {"session": "chat-7", "backend": "vllm-cuda", "artifact": "tinyllama@3f2a9c",
         "layout": "kv-v1", "epoch": 2, "instance": "w-9", "generation": 5,
         "replayable": False, "migratable": False}
STATES = {
    "valid": [STATE, {**STATE, "replayable": True, "migratable": True}],
    "invalid": [
        case("negative epoch", "InvalidValue", "state.epoch", {"/epoch": -1}),
        case("replayable as a string", "InvalidValue", "state.replayable",
             {"/replayable": "no"}),
        case("empty session", "InvalidValue", "state.session", {"/session": ""}),
        case("missing instance", "InvalidValue", "state.instance", delete=["/instance"]),
    ],
}

CPU = {"physical_id": "cpu0", "kind": "cpu", "name": "x86_64 host CPU",
       "execution_domain": "posix", "integration": "integrated", "pools": ["machine:ram"],
       "package": "socket0", "bandwidth_group": "dram0", "power_domain": None}
DEVICES = {
    "valid": [CPU,
              {"physical_id": "pci-0000:01:00.0", "kind": "gpu", "name": "discrete GPU",
               "execution_domain": "windows", "integration": "discrete",
               "pools": ["machine:vram:pci-0000:01:00.0", "machine:ram"], "package": None,
               "bandwidth_group": None, "power_domain": None},
              {"physical_id": "npu0", "kind": "npu", "name": "NPU", "execution_domain": "wsl",
               "integration": "unknown", "pools": ["wsl:quota", "machine:ram"],
               "package": None, "bandwidth_group": None, "power_domain": None}],
    "invalid": [
        case("unknown kind", "InvalidValue", "device.kind", {"/kind": "tpu"}),
        case("no pools", "InvalidValue", "device.pools", {"/pools": []}),
        case("repeated pool", "InvalidValue", "device.pools",
             {"/pools": ["machine:ram", "machine:ram"]}),
        case("pool without namespace", "InvalidValue", "device.pools[0]", {"/pools": ["ram"]}),
        case("pool with empty segment", "InvalidValue", "device.pools[0]",
             {"/pools": ["machine:vram:"]}),
        case("pool with a space", "InvalidValue", "device.pools[0]",
             {"/pools": ["machine:my ram"]}),
        case("unknown execution domain", "InvalidValue", "device.execution_domain",
             {"/execution_domain": "macos"}),
        case("unknown integration", "InvalidValue", "device.integration",
             {"/integration": "shared"}),
        case("empty physical id", "InvalidValue", "device.physical_id", {"/physical_id": ""}),
        case("physical id with a space", "InvalidValue", "device.physical_id",
             {"/physical_id": "gpu 0"}),
        case("missing pools", "InvalidValue", "device.pools", delete=["/pools"]),
    ],
}

METADATA = {"graph": "model.onnx", "example_inputs": "inputs/example.npz",
            "checkpoint_revision": "v1.2.0", "precision": "float32", "layout": "NCHW",
            "exporter": "torch.onnx 2.13", "calibration": None,
            "validation": {"max_abs_error": 0.001, "samples": 16}}
METADATAS = {
    "valid": [METADATA,
              {"graph": "g.onnx", "example_inputs": None, "checkpoint_revision": None,
               "precision": None, "layout": None, "exporter": None,
               "calibration": {"method": "minmax"}, "validation": None}],
    "invalid": [
        case("absolute graph path", "InvalidValue", "metadata.graph", {"/graph": "/model.onnx"}),
        case("calibration not an object", "InvalidValue", "metadata.calibration",
             {"/calibration": [1]}),
        case("missing graph", "InvalidValue", "metadata.graph", delete=["/graph"]),
    ],
}

MANIFEST = {"schema_version": 1, "component": "ocr-det",
            "files": {"inputs/example.npz": SHA_B, "model.onnx": SHA_A}, "metadata": METADATA}


def files_case(name: str, path: str, digest: str = SHA_A) -> dict[str, Any]:
    """A manifest whose files map holds one bad entry."""
    return case(name, "InvalidValue", f"manifest.files[{json.dumps(path)}]",
                {f"/files/{path.replace('~', '~0').replace('/', '~1')}": digest})


MANIFESTS = {
    "valid": [MANIFEST],
    "invalid": [
        files_case("parent segment", "../evil.onnx"),
        files_case("inner parent segment", "a/../b.onnx"),
        files_case("absolute path", "/etc/passwd"),
        files_case("backslash", "models\\m.onnx"),
        files_case("drive colon", "C:model.onnx"),
        files_case("empty segment", "a//b.onnx"),
        files_case("dot segment", "./m.onnx"),
        files_case("uppercase digest", "w.bin", SHA_A.upper()),
        files_case("short digest", "w.bin", SHA_A[:63]),
        case("graph not among the files", "InvalidValue", "manifest.metadata.graph",
             {"/metadata/graph": "other.onnx"}),
        case("example inputs not among the files", "InvalidValue",
             "manifest.metadata.example_inputs", {"/metadata/example_inputs": "x.npz"}),
        case("unknown schema version", "InvalidValue", "manifest.schema_version",
             {"/schema_version": 2}),
        case("no files", "InvalidValue", "manifest.files", {"/files": {}}),
        case("empty component", "InvalidValue", "manifest.component", {"/component": ""}),
        case("unknown metadata key", "InvalidValue", "manifest.metadata.license",
             {"/metadata/license": "MIT"}),
    ],
}

STALE = [
    {"name": f"other {key}", "set": {f"/{key}": value}}
    for key, value in [("session", "chat-8"), ("backend", "ort-cpu"),
                       ("artifact", "tinyllama@000000"), ("layout", "kv-v2"), ("epoch", 3),
                       ("instance", "w-10"), ("generation", 6)]
] + [{"name": "older epoch", "set": {"/epoch": 1}},
     {"name": "older generation", "set": {"/generation": 4}}]
ACCEPTED = [{"name": "identical", "set": {}},
            {"name": "replayable flag differs", "set": {"/replayable": True}},
            {"name": "migratable flag differs", "set": {"/migratable": True}}]
