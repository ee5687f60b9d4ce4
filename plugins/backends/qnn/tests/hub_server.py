"""A loopback HTTP server answering the AI Hub client's protocol-buffer API (tests only).

It speaks just enough of the REST API that ``qai_hub.Client`` uses for: the auth check,
the device list, model upload (multipart PUT), dataset upload (form POST) and download,
compile / profile / inference jobs with their states and results. Uploaded bytes are kept
in memory; inference "runs" the uploaded ONNX model with onnxruntime on the CPU, so the
outputs that come back are real outputs of that model, not canned values.
"""

from __future__ import annotations

import io
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import qai_hub.public_api_pb2 as api_pb

PB = "application/x-protobuf"
TOKEN = "loopback-token"
DEVICES = [("Samsung Galaxy S24 (Family)", "14", "Snapdragon 8 Gen 3 | SM8650",
            ["chipset:qualcomm-snapdragon-8gen3", "framework:qnn", "framework:onnx",
             "os:android"]),
           ("Snapdragon X Elite CRD", "11", "Snapdragon X Elite",
            ["chipset:qualcomm-snapdragon-x-elite", "framework:qnn", "framework:onnx",
             "os:windows"])]


@dataclass
class HubState:
    """What the fake service holds.

    Tests set ``fail_compile`` (a failure reason) to make compile jobs fail, and
    ``unavailable`` to answer that many API calls with 503 first.
    """

    fail_compile: str | None = None
    unavailable: int = 0
    polls_before_done: int = 2
    models: dict[str, bytes] = field(default_factory=dict)
    datasets: dict[str, bytes] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids):07d}"


def _layers(model: bytes) -> list[api_pb.LayerDetail]:
    import onnx

    graph = onnx.load_from_string(model).graph
    return [api_pb.LayerDetail(name=node.name or f"node{i}", layer_type_name=node.op_type,
                               id=str(i), compute_unit=api_pb.COMPUTE_UNIT_NPU,
                               delegate_name="QNN", execution_time=7 + i)
            for i, node in enumerate(graph.node)]


def _run_model(model: bytes, dataset: bytes) -> bytes:
    """Run every batch of the uploaded dataset through the model on ORT's CPU provider."""
    import h5py  # type: ignore[import-untyped]
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with h5py.File(io.BytesIO(dataset), "r") as source:
        entries = {str(group.attrs["name"]): [np.asarray(group[f"batch_{i}"])
                                              for i in range(int(group.attrs["batch_count"]))]
                   for group in source["data"].values()}
    count = len(next(iter(entries.values())))
    names = [o.name for o in session.get_outputs()]
    batches = [session.run(names, {k: v[b] for k, v in entries.items()}) for b in range(count)]
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as target:
        for index, name in enumerate(names):
            for b, values in enumerate(batches):
                target.create_dataset(f"data/{index}/batch_{b}", data=values[index])
            group = target[f"data/{index}"]
            group.attrs["order"] = index
            group.attrs["name"] = name
            group.attrs["batch_count"] = count
    return buffer.getvalue()


class _Handler(BaseHTTPRequestHandler):
    server: HubServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests are recorded in the state instead."""

    # -- plumbing ---------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            return self.rfile.read(length)
        if self.headers.get("Transfer-Encoding") == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return b""

    def _send(self, status: int, body: bytes = b"", ctype: str = PB,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _pb(self, message: Any) -> None:
        self._send(200, message.SerializeToString())

    def _dispatch(self, method: str) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        state.requests.append(f"{method} {url.path}")
        body = self._body()
        try:
            if parts[:1] == ["blob"]:
                self._blob(method, parts[1:], body)
                return
            if parts[:2] != ["api", "v1"]:
                self._send(404, b"not found", "text/plain")
                return
            if state.unavailable > 0:
                state.unavailable -= 1
                self._send(503, b"service unavailable", "text/plain")
                return
            if self.headers.get("Authorization") != f"token {self.server.token}":
                self._send(401, b'{"detail":"Invalid token."}', "application/json")
                return
            self._api(method, parts[2:], body, parse_qs(url.query))
        except KeyError as exc:
            self._send(404, f"unknown: {exc}".encode(), "text/plain")

    def do_GET(self) -> None:
        """GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """POST."""
        self._dispatch("POST")

    def do_PUT(self) -> None:
        """PUT."""
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        """PATCH."""
        self._dispatch("PATCH")

    # -- the API ----------------------------------------------------------------------

    def _blob(self, method: str, parts: list[str], body: bytes) -> None:
        state = self.server.state
        kind, key = parts[0], parts[1]
        store = state.models if kind == "model" else state.datasets
        if method == "GET":
            self._send(200, store[key], "application/octet-stream")
            return
        if method == "POST":
            body = _form_file(self.headers.get("Content-Type", ""), body)
        store[key] = store.get(key, b"") + body if method == "PUT" else body
        self._send(200, b"", "text/plain", {"ETag": f'"etag-{key}-{len(body)}"'})

    def _api(self, method: str, parts: list[str], body: bytes,
             query: dict[str, list[str]]) -> None:
        state = self.server.state
        base = self.server.base
        if parts == ["users", "auth", "user"]:
            self._pb(api_pb.User(id=1, email="tester@loopback", token=self.server.token,
                                 default_project_id="p1"))
        elif parts == ["devices"]:
            devices = [api_pb.Device(name=n, os=o, soc_description=s, attributes=a)
                       for n, o, s, a in DEVICES
                       if not query.get("name") or query["name"][0] in ("", n)]
            self._pb(api_pb.DeviceList(devices=devices, total_query_count=len(devices)))
        elif parts == ["models"] and method == "POST":
            model = api_pb.Model()
            model.ParseFromString(body)
            model_id = state.new_id("m")
            state.models[model_id] = b""
            self._pb(api_pb.CreateUpdateResponse(id=model_id))
        elif parts[:1] == ["models"] and parts[2:] == ["multipart_upload"]:
            if method == "GET":
                urls = api_pb.FileMultipartUploadURL(
                    urls=[f"{base}/blob/model/{parts[1]}"], max_part_size=1 << 30,
                    upload_id="u1")
                self._pb(api_pb.FileUploadResponse(multipart_url=urls))
            else:
                self._pb(api_pb.CreateUpdateResponse(id=parts[1]))
        elif parts[:1] == ["models"] and len(parts) == 2:
            self._pb(api_pb.Model(model_id=parts[1], name=parts[1], file_upload_complete=True,
                                  model_type=api_pb.MODEL_TYPE_ONNX))
        elif parts == ["datasets"] and method == "POST":
            dataset_id = state.new_id("d")
            state.datasets[dataset_id] = b""
            self._pb(api_pb.CreateUpdateResponse(id=dataset_id))
        elif parts[:1] == ["datasets"] and parts[2:] == ["upload_url"]:
            self._pb(api_pb.FileUploadResponse(url=api_pb.FileUploadURL(
                url=f"{base}/blob/dataset/{parts[1]}", file_field_name="file")))
        elif parts[:1] == ["datasets"] and parts[2:] == ["download_data"]:
            self._pb(api_pb.FileDownloadResponse(url=api_pb.FileDownloadURL(
                url=f"{base}/blob/dataset/{parts[1]}", filename=f"{parts[1]}.h5")))
        elif parts[:1] == ["datasets"] and len(parts) == 2:
            if method == "GET":
                self._pb(api_pb.Dataset(dataset_id=parts[1], name=parts[1],
                                        file_upload_complete=True))
            else:
                self._pb(api_pb.CreateUpdateResponse(id=parts[1]))
        elif parts == ["jobs"] and method == "POST":
            self._create_job(body)
        elif parts[:1] == ["jobs"] and parts[2:] == ["result"]:
            self._pb(self._result(state.jobs[parts[1]]))
        elif parts[:1] == ["jobs"] and len(parts) == 2:
            self._pb(self._job(state.jobs[parts[1]]))
        else:
            self._send(404, f"no route {method} {'/'.join(parts)}".encode(), "text/plain")

    def _create_job(self, body: bytes) -> None:
        state = self.server.state
        job = api_pb.Job()
        job.ParseFromString(body)
        kind = job.WhichOneof("job")
        job_id = state.new_id("j")
        record: dict[str, Any] = {"id": job_id, "kind": kind, "pb": job, "polls": 0}
        if kind == "compile_job":
            record["failure"] = state.fail_compile
            record["model"] = job.compile_job.model.model_id
            record["target"] = state.new_id("m")
            state.models[record["target"]] = state.models[record["model"]]
        else:
            record["model"] = job.inference_job.model.model_id
            record["dataset"] = job.inference_job.dataset.dataset_id
            record["profile"] = job.inference_job.is_profiling_on
        state.jobs[job_id] = record
        self._pb(api_pb.CreateUpdateResponse(id=job_id))

    def _state_of(self, record: dict[str, Any]) -> Any:
        record["polls"] += 1
        if record["polls"] <= self.server.state.polls_before_done:
            return {"compile_job": api_pb.JOB_STATE_OPTIMIZING_MODEL,
                    "profile_job": api_pb.JOB_STATE_MEASURING_PERFORMANCE,
                    }.get(record["kind"], api_pb.JOB_STATE_RUNNING_INFERENCE)
        if record.get("failure"):
            return api_pb.JOB_STATE_FAILED
        return api_pb.JOB_STATE_DONE

    def _job(self, record: dict[str, Any]) -> api_pb.Job:
        job_state = self._state_of(record)
        done = job_state == api_pb.JOB_STATE_DONE
        source: api_pb.Job = record["pb"]
        kind = record["kind"]
        reason = record.get("failure") or "" if job_state == api_pb.JOB_STATE_FAILED else ""
        if kind == "compile_job":
            inner: Any = api_pb.CompileJob()
            inner.CopyFrom(source.compile_job)
            inner.compile_job_id = record["id"]
            inner.target_model.CopyFrom(api_pb.Model(
                model_id=record["target"], name="compiled", file_upload_complete=done,
                model_type=api_pb.MODEL_TYPE_ONNX))
            fields: dict[str, Any] = {"compile_job": inner}
        else:
            inner_i = api_pb.InferenceJob()
            inner_i.CopyFrom(source.inference_job)
            inner_i.inference_job_id = record["id"]
            fields = {"inference_job": inner_i}
            inner = inner_i
        inner.job_state = job_state
        inner.failure_reason = reason
        inner.user_id = 1
        return api_pb.Job(**fields)

    def _result(self, record: dict[str, Any]) -> api_pb.JobResult:
        state = self.server.state
        model = state.models[record["model"]]
        if record["kind"] == "compile_job":
            return api_pb.JobResult(compile_job_result=api_pb.CompileJobResult(
                compile_job_id=record["id"]))
        result = api_pb.InferenceJobResult(inference_job_id=record["id"])
        if record["profile"]:
            result.detail.CopyFrom(api_pb.ProfileDetail(
                execution_time=1234, peak_memory_usage=5 << 20, load_time=40000,
                major_version=1, minor_version=0, after_execution_peak_memory=5 << 20,
                cold_load_time=40000, warm_load_time=20000, compile_time=90000,
                layer_details=_layers(model)))
        if record["dataset"]:
            if "output" not in record:
                output = state.new_id("d")
                state.datasets[output] = _run_model(model, state.datasets[record["dataset"]])
                record["output"] = output
            result.output_dataset_id = record["output"]
        return api_pb.JobResult(inference_job_result=result)


def _form_file(content_type: str, body: bytes) -> bytes:
    """The file part of a multipart/form-data body."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            payload = part.get_payload(decode=True)
            return payload if isinstance(payload, bytes) else b""
    return b""


class HubServer(ThreadingHTTPServer):
    """The loopback service on 127.0.0.1 (an ephemeral port); a context manager."""

    daemon_threads = True

    def __init__(self, token: str = TOKEN) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token = token
        self.state = HubState()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        """The service's base URL."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
