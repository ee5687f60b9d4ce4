"""Cases of the wire value types (shared-memory refs, tensor specs, frame headers, limits).

Also the feature negotiation cases and the dtype names, all plain JSON data.
"""

from __future__ import annotations

from .common import ALL_FEATURES, MiB, case

REF = {"segment": "edge_0badcafe_k3v9", "offset": 4096, "generation": 7}
SPEC = {"name": "image", "dtype": "uint8", "shape": [1, 3, 4, 4], "nbytes": 48, "ref": None}
SHM_SPEC = {"name": "kv", "dtype": "float16", "shape": [2, 1024], "nbytes": 4096, "ref": REF}
HEADER = {"version": 1, "required_features": ["shm-tensors"], "op": "call",
          "request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
          "meta": {"bucket": "640x640"}, "tensors": [SPEC, SHM_SPEC]}
WIRE_TYPES = {
    "ShmRef": {
        "valid": [REF],
        "invalid": [
            case("segment with a slash", "DescriptorInvalid", "ref.segment",
                 {"/segment": "/psm_1"}),
            case("negative offset", "DescriptorInvalid", "ref.offset", {"/offset": -1}),
            case("boolean generation", "DescriptorInvalid", "ref.generation",
                 {"/generation": True}),
        ],
    },
    "TensorSpec": {
        "valid": [SPEC, SHM_SPEC],
        "invalid": [
            case("nbytes off by one", "DescriptorInvalid", "tensor.nbytes", {"/nbytes": 49}),
            case("33 dimensions", "DescriptorInvalid", "tensor.shape",
                 {"/shape": [1] * 33, "/nbytes": 1}),
            case("negative dimension", "DescriptorInvalid", "tensor.shape[0]",
                 {"/shape": [-1, 3, 4, 4]}),
            case("unknown dtype", "DescriptorInvalid", "tensor.dtype", {"/dtype": "complex64"}),
            case("empty name", "DescriptorInvalid", "tensor.name", {"/name": ""}),
            case("missing ref", "DescriptorInvalid", "tensor.ref", delete=["/ref"]),
            case("bad ref offset", "DescriptorInvalid", "tensor.ref.offset",
                 {"/ref/offset": -4}, base=1),
        ],
    },
    "FrameHeader": {
        "valid": [HEADER,
                  {**HEADER, "required_features": [], "op": "hello", "request_id": "",
                   "stage_id": "", "tensors": [], "meta": {"offered_features": ["cancel"]}}],
        "invalid": [
            case("op in capitals", "HeaderMalformed", "header.op", {"/op": "Call"}),
            case("request id with a control character", "HeaderMalformed", "header.request_id",
                 {"/request_id": "a\u0007"}),
            case("negative epoch", "HeaderMalformed", "header.epoch", {"/epoch": -1}),
            case("meta not an object", "HeaderMalformed", "header.meta", {"/meta": [1]}),
            case("malformed feature name", "HeaderMalformed", "header.required_features",
                 {"/required_features": ["Shm Tensors"]}),
            case("repeated tensor name", "DescriptorInvalid", "header.tensors[1].name",
                 {"/tensors/1/name": "image"}),
            case("shared-memory tensor without its feature", "DescriptorInvalid",
                 "header.tensors[1].ref", {"/required_features": []}),
            case("tensor nbytes off by one", "DescriptorInvalid", "header.tensors[0].nbytes",
                 {"/tensors/0/nbytes": 47}),
            case("version 0", "HeaderMalformed", "header.version", {"/version": 0}),
            case("missing meta", "HeaderMalformed", "header.meta", delete=["/meta"]),
        ],
    },
    "Limits": {
        "valid": [{"max_header_bytes": 65536, "max_io_bytes": MiB, "max_tensors": 1024,
                   "supported_features": ALL_FEATURES},
                  {"max_header_bytes": 64, "max_io_bytes": 0, "max_tensors": 0,
                   "supported_features": []}],
        "invalid": [
            case("negative max_io_bytes", "InvalidValue", "limits.max_io_bytes",
                 {"/max_io_bytes": -1}),
            case("zero max_header_bytes", "InvalidValue", "limits.max_header_bytes",
                 {"/max_header_bytes": 0}),
            case("max_header_bytes beyond u32", "InvalidValue", "limits.max_header_bytes",
                 {"/max_header_bytes": 2**32}),
            case("malformed feature", "InvalidValue", "limits.supported_features",
                 {"/supported_features": ["Bad Name"]}),
        ],
    },
}

NEGOTIATION = [
    {"name": "nothing required", "required": [], "offered": [], "supported": ALL_FEATURES,
     "agreed": []},
    {"name": "offered features are used when supported", "required": ["shm-tensors"],
     "offered": ["cancel", "future-x"], "supported": ALL_FEATURES,
     "agreed": ["cancel", "shm-tensors"]},
    {"name": "unknown required feature", "required": ["shm-tensors", "future-x"],
     "offered": [], "supported": ALL_FEATURES, "error": "UnknownRequiredFeature",
     "field": "features.required"},
    {"name": "known feature this side does not support", "required": ["bfloat16"],
     "offered": [], "supported": ["cancel"], "error": "UnknownRequiredFeature",
     "field": "features.required"},
    {"name": "malformed feature name", "required": ["Shm Tensors"], "offered": [],
     "supported": ALL_FEATURES, "error": "InvalidValue", "field": "features.required"},
]

DTYPES = {
    "valid": [{"name": n, "itemsize": s} for n, s in [
        ("bool", 1), ("int8", 1), ("int16", 2), ("int32", 4), ("int64", 8), ("uint8", 1),
        ("uint16", 2), ("uint32", 4), ("uint64", 8), ("float16", 2), ("float32", 4),
        ("float64", 8), ("bfloat16", 2)]],
    "invalid": ["float", "f4", "FLOAT32", "bf16", "complex64", "int", "float8", ""],
}
