"""Errors of a pipeline's own code while a request runs, answered as the server's fault.

In-process: the ASGI application over real pipelines (real worker processes), driven
through httpx's ASGI transport. A stage's input transform that raises — a ``ConfigError``
from a ``Fanout`` it built wrong — is the pipeline's failure (500 ``transform_failed``),
never the client's (400), as is a transform that returns no mapping of input names (500
``transform_return_invalid``) and a stage after the first that refuses the inputs its
transform built (500 ``transform_output_refused``); a transform's typed refusal of the
request's own input, a malformed tensor refused before any stage or by the first, and a
parameter the client sent refused by the last stage stay 400. A bundle verified in place
and rewritten since its stage opened, met where ``finish`` or a transform reads the
stage's bundle folder, is 503 ``bundle_changed`` (the pipeline cannot serve as it was
opened), not the finish's own failure. After each, nothing is held; every test fails if
it leaks a process, a segment or a descriptor.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.app import ServerState, build_app
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def _body(x: np.ndarray) -> dict[str, Any]:
    return {"inputs": {"x": {"dtype": str(x.dtype), "shape": list(x.shape),
                             "data": base64.b64encode(x.tobytes()).decode()}}}


GOOD = _body(np.ones((2, 2), np.float32))
NEGATIVE = _body(-np.ones((2, 2), np.float32))


def _two_stages(name: str, transform: str) -> dict[str, Any]:
    return {"name": name, "stages": [
        {"id": "a", "backend": {"name": "echo"}},
        {"id": "b", "backend": {"name": "echo"}, "input_transform": transform}]}


@pytest.fixture
def ledger() -> ResourceLedger:
    return ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])


@pytest.fixture
def pipelines(ledger: ResourceLedger) -> Iterator[dict[str, Pipeline]]:
    """``fanout``: echo, then echo behind a transform that builds a ``Fanout`` wrong;
    ``checked``: echo, then echo behind a transform that refuses a negative request input
    with ``InvalidValue`` naming ``inputs['x']``."""
    plugins = load_plugins(env={"EDGE_PLUGINS": "echo"})
    opened: dict[str, Pipeline] = {}
    try:
        for name, transform in (("fanout", "edge_echo.transforms:bad_fanout"),
                                ("checked", "edge_echo.transforms:refuse_negative_input")):
            opened[name] = Pipeline.open(load_pipeline(_two_stages(name, transform)),
                                         plugins, ledger, retire_deadline_s=3.0)
        yield opened
    finally:
        for pipeline in opened.values():
            pipeline.close()
        assert ledger.snapshot()["reservations"] == []


def _held(pipelines: dict[str, Pipeline]) -> dict[str, Any]:
    """What requests hold now: admission, each stage's outstanding calls and slots, and
    the workers (generation and state) serving."""
    return {name: (p.admission.used, [(s.outstanding, s.slots.used, s.generation,
                                       s.state.value) for s in p.stages])
            for name, p in pipelines.items()}


def test_a_transform_that_raises_config_error_is_500_naming_it_not_400(
        pipelines: dict[str, Pipeline], ledger: ResourceLedger,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The request was well formed; the pipeline's transform built a ``Fanout`` wrong and
    ``Fanout`` raised ``ConfigError``. It was answered 400 ``refused`` (``param``
    ``request``: the client told to mend a request that had nothing wrong): now 500
    ``transform_failed`` naming the stage's transform and the error's type and message,
    its traceback logged once. A transform's typed refusal of the request's own input and
    a malformed tensor stay 400; nothing is held afterwards and the pipelines serve on."""
    held = ledger.holdings()
    workers = _held(pipelines)
    with ThreadPoolExecutor(4) as executor:
        served = {name: ServedPipeline(p, executor, private_upload_dir())
                  for name, p in pipelines.items()}
        app = build_app(ServerState(served, ledger, max_body_bytes=1 << 20))

        async def scenario() -> dict[str, list[httpx.Response]]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
                fanout = [await client.post("/v1/pipelines/fanout/run", json=GOOD)
                          for _ in range(2)]
                checked = [await client.post("/v1/pipelines/checked/run", json=body)
                           for body in (NEGATIVE, GOOD)]
                malformed = {"inputs": {"x": {**GOOD["inputs"]["x"], "shape": [3, 2]}}}
                cut = [await client.post(f"/v1/pipelines/{name}/run", json=malformed)
                       for name in ("fanout", "checked")]
                return {"fanout": fanout, "checked": checked, "malformed": cut}

        replies = asyncio.run(scenario())
    message = ("pipelines[fanout].stages[b].input_transform: transform "
               "edge_echo.transforms:bad_fanout raised ConfigError: Fanout.items[0]: must be "
               "a mapping of inputs: 'ndarray'")
    for reply in replies["fanout"]:
        assert reply.status_code == 500, reply.text
        assert reply.headers["x-should-retry"] == "false"
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "server_error", "transform_failed", None)
        assert error["message"] == message
        assert error["edge"] == {
            "status": 500, "kind": "TransformFailed",
            "field": "pipelines[fanout].stages[b].input_transform",
            "reason": "transform edge_echo.transforms:bad_fanout raised ConfigError"}
    refused, answered = replies["checked"]
    assert refused.status_code == 400, refused.text  # the request's own fault, still
    error = refused.json()["error"]
    assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
        "invalid_value", "InvalidValue", "inputs['x']")
    assert "must not be negative" in error["message"]
    assert answered.status_code == 200, answered.text
    for reply in replies["malformed"]:  # refused before any stage, as it was
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["edge"]["field"] == "inputs['x'].data"
    logged = capsys.readouterr().err
    assert logged.count("edge serve: error: ") == 1, logged  # once for two failures
    assert f"edge serve: error: {message} (answered 500; logged once per transform, " \
        "with its traceback):\nTraceback" in logged
    assert "return Fanout(items=[previous[\"x\"]])" in logged
    assert ledger.holdings() == held
    assert _held(pipelines) == workers  # nothing held, the same workers serve on


def _answers(pipelines: dict[str, Pipeline], ledger: ResourceLedger,
             asked: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST each body to its pipeline's ``run`` route of one in-process server, in turn."""
    with ThreadPoolExecutor(4) as executor:
        served = {name: ServedPipeline(p, executor, private_upload_dir())
                  for name, p in pipelines.items()}
        app = build_app(ServerState(served, ledger, max_body_bytes=1 << 20))

        async def scenario() -> list[httpx.Response]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
                return [await client.post(f"/v1/pipelines/{name}/run", json=body)
                        for name, body in asked]

        return asyncio.run(scenario())


def _server_error(reply: httpx.Response, code: str, kind: str, field: str) -> dict[str, Any]:
    """The error of a 500 answer that is the server's fault, checked: its ``code``,
    ``edge.kind`` and ``edge.field``, ``param`` null, no retry."""
    assert reply.status_code == 500, reply.text
    assert reply.headers["x-should-retry"] == "false"
    error: dict[str, Any] = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", code, None)
    assert (error["edge"]["kind"], error["edge"]["field"]) == (kind, field)
    return error


def test_a_stage_refusing_what_its_transform_built_is_500_naming_both_not_400(
        ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """Good requests; a stage after the first refused the inputs its transform built, as
    it refuses a client's malformed tensor: before sending (``unsendable``: an array of
    objects, ``InvalidValue`` naming ``inputs.x.dtype``), in its worker in the middle of
    the chain (``bools``: a bool tensor holding 7, ``BoolInputInvalid`` declared a request
    fault), or last, a parameter the transform asked for (``asked``: ``refuse``). Each
    was answered 400 with the refusal's ``code`` and ``param`` (the client told to mend
    ``inputs.x`` it had sent right): now 500 ``transform_output_refused`` naming the
    refusing stage's ``input_transform``, the transform and the refusal, logged once per
    transform. The client's own bool tensor holding 7 is still 400 (the client's own
    ``refuse``: see the next test). Nothing is held afterwards."""
    def chain(name: str, transform: str, more: int = 0) -> Pipeline:
        stages = [{"id": "a", "backend": {"name": "echo"}},
                  {"id": "b", "backend": {"name": "echo"},
                   "input_transform": f"edge_echo.transforms:{transform}"}]
        stages += [{"id": "c", "backend": {"name": "echo"},
                    "input_transform": "edge_echo.transforms:passthrough"}][:more]
        return Pipeline.open(load_pipeline({"name": name, "stages": stages}),
                             load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                             retire_deadline_s=3.0)

    pipelines: dict[str, Pipeline] = {}
    try:
        for name, transform, more in (("unsendable", "unsendable", 0),
                                      ("bools", "out_of_range_bools", 1),
                                      ("asked", "ask_refusal", 0)):
            pipelines[name] = chain(name, transform, more)
        held = ledger.holdings()
        workers = _held(pipelines)
        bools = {"inputs": {"x": {"dtype": "bool", "shape": [3],
                                  "data": base64.b64encode(bytes([0, 1, 7])).decode()}}}
        replies = _answers(pipelines, ledger, [
            ("unsendable", GOOD), ("unsendable", GOOD), ("bools", GOOD), ("asked", GOOD),
            ("bools", bools)])
        logged = capsys.readouterr().err
        assert ledger.holdings() == held
        assert _held(pipelines) == workers  # nothing held, the same workers serve on
    finally:
        for pipeline in pipelines.values():
            pipeline.close()
    assert ledger.snapshot()["reservations"] == []
    for reply in replies[:2]:
        error = _server_error(reply, "transform_output_refused", "TransformOutputRefused",
                              "pipelines[unsendable].stages[b].input_transform")
        assert error["message"].startswith(
            "pipelines[unsendable].stages[b].input_transform: stage 'b' refused the inputs "
            "transform edge_echo.transforms:unsendable returned (InvalidValue): "
            "inputs.x.dtype: unsupported dtype "), error
        assert error["edge"]["reason"] == ("stage 'b' refused the inputs transform "
                                           "edge_echo.transforms:unsendable returned "
                                           "(InvalidValue)")
    error = _server_error(replies[2], "transform_output_refused", "TransformOutputRefused",
                          "pipelines[bools].stages[b].input_transform")
    assert error["message"] == (
        "pipelines[bools].stages[b].input_transform: stage 'b' refused the inputs transform "
        "edge_echo.transforms:out_of_range_bools returned (BoolInputInvalid): inputs.x: a "
        "bool tensor's bytes must each be 0 or 1 (the largest is shown): 7")
    error = _server_error(replies[3], "transform_output_refused", "TransformOutputRefused",
                          "pipelines[asked].stages[b].input_transform")
    assert error["message"].endswith("returned (ParamRefused): params.refuse: refused as "
                                      "the request asked: 'asked by the transform'")
    reply = replies[4]  # the client's own bool tensor holding 7, refused before any stage
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "inputs['x'].data"), error
    lines = [line for line in logged.splitlines() if line.startswith("edge serve: error: ")]
    assert [line.split(".input_transform: ")[0] for line in lines] == [
        f"edge serve: error: pipelines[{name}].stages[b]"
        for name in ("unsendable", "bools", "asked")]  # once per transform
    assert all(line.endswith("(answered 500; logged once per transform)") for line in lines)


def test_an_ort_stage_refusing_the_dtype_its_transform_built_is_500_not_400(
        tmp_path: Path, ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ort-cpu add-relu stages serving float32 ``x`` of shape (2, 3); stage ``b``'s
    transform hands it the previous ``y`` as float64. Its controller refused that with
    ``ShapeRefused`` (code ``unsupported_shape``), answered 400 naming ``inputs.x``: the
    client told that its float32 request was of a dtype not served. Now 500
    ``transform_output_refused`` naming ``b``'s transform and the refusal; the client's
    own float64 ``x`` is still 400 ``unsupported_shape`` naming ``inputs.x``."""
    from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

    bundle = write_add_relu_bundle(tmp_path / "add")
    config = {"name": "wide", "stages": [
        {"id": "a", "manifest": str(bundle), "backend": {"name": "ort-cpu"}},
        {"id": "b", "manifest": str(bundle), "backend": {"name": "ort-cpu"},
         "input_transform": "edge_echo.transforms:y_as_float64"}]}
    pipelines = {"wide": Pipeline.open(load_pipeline(config),
                                       load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}), ledger,
                                       retire_deadline_s=3.0)}
    try:
        held = ledger.holdings()
        workers = _held(pipelines)
        good, wide = _body(EXAMPLE_X), _body(EXAMPLE_X.astype(np.float64))
        replies = _answers(pipelines, ledger, [("wide", good), ("wide", wide)])
        capsys.readouterr()
        assert ledger.holdings() == held
        assert _held(pipelines) == workers
    finally:
        pipelines["wide"].close()
    assert ledger.snapshot()["reservations"] == []
    error = _server_error(replies[0], "transform_output_refused", "TransformOutputRefused",
                          "pipelines[wide].stages[b].input_transform")
    assert error["message"].startswith(
        "pipelines[wide].stages[b].input_transform: stage 'b' refused the inputs transform "
        "edge_echo.transforms:y_as_float64 returned (ShapeRefused): inputs.x: dtype float64 "
        "is not served (only float32)"), error
    assert replies[1].status_code == 400, replies[1].text  # the client's own float64
    error = replies[1].json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_shape", "inputs.x"), error


def test_whose_value_the_last_stage_refused_decides_400_or_500(
        ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """The last stage gets the client's parameters with what its transform's ``Call``
    asked merged over them. ``asked``'s transform writes ``refuse`` over the client's own:
    that was answered 400 naming ``refuse`` (the client told to mend a value the stage
    never saw); it is 500 ``transform_output_refused`` now. A refusal naming no field
    (``refuse_unnamed``: the stage cannot say which value) was 500 even when the client
    had sent it; it is 400 (``param`` null, ``edge.field`` ``request``) when any
    parameter the client sent reached the stage, and 500 when none did: the client sent
    none, or the transform wrote over each. The client's own ``refuse`` is still 400
    naming it. Nothing is held afterwards."""
    pipelines: dict[str, Pipeline] = {}
    try:
        for name, transform in (("asked", "ask_refusal"), ("plain", "passthrough"),
                                ("unnamed", "ask_unnamed_refusal")):
            pipelines[name] = Pipeline.open(
                load_pipeline(_two_stages(name, f"edge_echo.transforms:{transform}")),
                load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger, retire_deadline_s=3.0)
        held = ledger.holdings()
        workers = _held(pipelines)
        replies = _answers(pipelines, ledger, [
            ("asked", {**GOOD, "params": {"refuse": "the client's"}}),
            ("plain", {**GOOD, "params": {"refuse": "the client's"}}),
            ("plain", {**GOOD, "params": {"refuse_unnamed": "the client's"}}),
            ("unnamed", {**GOOD, "params": {"delay_s": 0}}),
            ("unnamed", GOOD),
            ("unnamed", {**GOOD, "params": {"refuse_unnamed": "the client's"}})])
        capsys.readouterr()
        assert ledger.holdings() == held
        assert _held(pipelines) == workers  # nothing held, the same workers serve on
    finally:
        for pipeline in pipelines.values():
            pipeline.close()
    assert ledger.snapshot()["reservations"] == []
    error = _server_error(replies[0], "transform_output_refused", "TransformOutputRefused",
                          "pipelines[asked].stages[b].input_transform")
    assert error["message"].endswith("returned (ParamRefused): params.refuse: refused as "
                                     "the request asked: 'asked by the transform'"), error
    for reply, param, field, told in (
            (replies[1], "refuse", "refuse", "the client's"),
            (replies[2], None, "request", "the client's"),
            (replies[3], None, "request", "asked by the transform")):  # (no field: the
        # client's delay_s reached the stage, part of what it refused)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"], error["edge"]["field"]) == (
            "invalid_value", param, field), error
        assert error["message"].endswith(f"{told!r}"), error
    for reply in replies[4:]:
        error = _server_error(reply, "transform_output_refused", "TransformOutputRefused",
                              "pipelines[unnamed].stages[b].input_transform")
        assert error["message"].endswith(
            "returned (RequestRefused): the request was refused as a whole, as it asked: "
            "'asked by the transform'"), error


def test_a_malformed_reply_of_a_worker_is_500_naming_the_stage_not_400(
        ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker that answers with a well-framed ERROR event carrying no error
    (:mod:`malformed_worker`): the controller refused the event with ``InvalidValue``
    naming ``event.error``, answered 400 ``invalid_value`` with ``param`` ``event.error``
    (the client told to mend a field it never sent), and the stage's slot stayed taken:
    the next request waited for it for ever. Now the worker's malformed reply is a
    ``ProtocolViolation``: 500 ``worker_protocol_violation`` naming the stage and the
    event's field, logged once; the stage's slot is free and the same worker answers the
    next request. Nothing is held afterwards."""
    import sys

    route = {"name": "malformed", "interpreter": sys.executable,
             "entry": "malformed_worker:create", "python_path": [str(Path(__file__).parent)]}
    config = {"name": "odd", "stages": [
        {"id": "m", "backend": {"name": "echo", "route": route}}]}
    pipelines = {"odd": Pipeline.open(load_pipeline(config),
                                      load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                                      retire_deadline_s=3.0)}
    try:
        held = ledger.holdings()
        workers = _held(pipelines)
        bad = {**GOOD, "params": {"fail_call": True}, "deadline_s": 20}
        replies = _answers(pipelines, ledger, [("odd", bad), ("odd", {**GOOD, "deadline_s": 20}),
                                               ("odd", bad)])
        logged = capsys.readouterr().err
        assert ledger.holdings() == held
        assert _held(pipelines) == workers  # its slot free, the same worker serves on
    finally:
        pipelines["odd"].close()
    assert ledger.snapshot()["reservations"] == []
    for reply in replies[0], replies[2]:
        error = _server_error(reply, "worker_protocol_violation", "ProtocolViolation",
                              "stages[m].event.error")
        assert error["message"] == ("stages[m].event.error: the worker sent a malformed "
                                    "event: kind error needs an ErrorInfo: None"), error
    assert replies[1].status_code == 200, replies[1].text
    lines = [line for line in logged.splitlines() if line.startswith("edge serve: error: ")]
    assert lines == ["edge serve: error: stages[m].event.error: the worker sent a malformed "
                     "event: kind error needs an ErrorInfo: None (answered 500; logged once "
                     "per field)"], logged


def test_a_transform_returning_no_mapping_is_500_transform_return_invalid_naming_it(
        ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """A transform that returned a list of pairs (no mapping of input names) failed the
    request with ``TransformReturnInvalid``, which the server answered as any error it
    does not know: 500 ``internal_error`` naming the field ``request``. It is 500
    ``transform_return_invalid`` now, ``edge.field`` the stage's ``input_transform``, the
    message naming the transform and what it returned, logged once per transform without
    the line for an unknown error type. Nothing is held afterwards."""
    config = {"name": "pairs", "stages": [
        {"id": "a", "backend": {"name": "echo"}},
        {"id": "b", "backend": {"name": "echo"},
         "input_transform": "edge_echo.transforms:returns_pairs"}]}
    pipelines = {"pairs": Pipeline.open(load_pipeline(config),
                                        load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                                        retire_deadline_s=3.0)}
    try:
        held = ledger.holdings()
        workers = _held(pipelines)
        replies = _answers(pipelines, ledger, [("pairs", GOOD), ("pairs", GOOD)])
        logged = capsys.readouterr().err
        assert ledger.holdings() == held
        assert _held(pipelines) == workers
    finally:
        pipelines["pairs"].close()
    assert ledger.snapshot()["reservations"] == []
    message = ("pipelines[pairs].stages[b].input_transform: transform "
               "edge_echo.transforms:returns_pairs returned a list, not a mapping of input "
               "names (str) to arrays, a Fanout or a Call: [('x', array(")
    for reply in replies:
        error = _server_error(reply, "transform_return_invalid", "TransformReturnInvalid",
                              "pipelines[pairs].stages[b].input_transform")
        assert error["message"].startswith(message), error
        assert error["edge"]["reason"] == (
            "transform edge_echo.transforms:returns_pairs returned a list, not a mapping of "
            "input names (str) to arrays, a Fanout or a Call")
    assert logged.count("edge serve: error: ") == 1, logged  # once for two failures
    assert logged.startswith(f"edge serve: error: {message}")  # (the list's repr: 2 lines)
    assert logged.endswith("(answered 500; logged once per transform)\n")


def _rewrite(bundle: Path) -> str:
    """Rewrite ``bundle`` in place, consistently (a fresh verification passes): other
    example inputs, so another manifest; its manifest sha256 now."""
    from edge_core.artifacts import create_manifest, verify_bundle
    from edge_ort.bundles import EXAMPLE_X

    x = EXAMPLE_X + 1
    np.savez(bundle / "example_inputs.npz", x=x)
    np.savez(bundle / "expected.npz", y=np.maximum(x + x, 0))
    create_manifest(bundle, component="add-relu", example_inputs="example_inputs.npz",
                    expected_outputs="expected.npz", precision="fp32",
                    exporter="onnx.helper", overwrite=True)
    return verify_bundle(bundle, stage=False).manifest_sha256


def test_a_bundle_rewritten_under_finish_or_a_transform_is_503_bundle_changed(
        tmp_path: Path, ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """ort-cpu stages verified in place (``stage_bundle = false``); ``finish`` (pipeline
    ``read``) and a transform (pipeline ``chain``) read their stages' bundle folders. Once
    a bundle is rewritten, reading its folder raises ``BundleChanged``: from ``finish``
    it was answered as any error of the finish's own code, 500 ``finish_failed`` with
    the message cut at 500 characters. The request and the pipeline's code are fine; the
    pipeline cannot serve as it was opened, as for a stage whose restart was refused for
    the same reason: 503 ``bundle_changed`` naming the manifest, both sha256s and the
    reason, ``x-should-retry: false`` and no ``Retry-After`` (the same request fails the
    same way until the pipeline is opened again), logged once per bundle. The results
    are acknowledged: nothing is held."""
    from edge_core.artifacts import verify_bundle
    from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

    bundles = {name: write_add_relu_bundle(tmp_path / name) for name in ("f", "a", "b")}
    opened = {name: verify_bundle(path, stage=False).manifest_sha256
              for name, path in bundles.items()}

    def stage(stage_id: str, bundle: str, **more: str) -> dict[str, Any]:
        return {"id": stage_id, "manifest": str(bundles[bundle]),
                "backend": {"name": "ort-cpu", "options": {"stage_bundle": False}}, **more}

    configs = {
        "read": {"name": "read", "finish": "bundle_finish:finish", "stages": [stage("s", "f")]},
        "chain": {"name": "chain", "stages": [
            stage("a", "a"), stage("b", "b", input_transform="edge_echo.transforms:read_tables")]},
    }
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    pipelines: dict[str, Pipeline] = {}
    body = {"inputs": {"x": {"dtype": "float32", "shape": [2, 3],
                             "data": base64.b64encode(EXAMPLE_X.tobytes()).decode()}}}
    try:
        for name, config in configs.items():
            pipelines[name] = Pipeline.open(load_pipeline(config), plugins, ledger,
                                            retire_deadline_s=3.0)
        held = ledger.holdings()
        workers = _held(pipelines)
        with ThreadPoolExecutor(4) as executor:
            served = {name: ServedPipeline(p, executor, private_upload_dir())
                      for name, p in pipelines.items()}
            app = build_app(ServerState(served, ledger, max_body_bytes=1 << 20))

            async def ask(names: list[str], sent: dict[str, Any] = body) -> list[httpx.Response]:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://edge") as client:
                    return [await client.post(f"/v1/pipelines/{name}/run", json=sent)
                            for name in names]

            before = asyncio.run(ask(["read", "chain"]))
            assert [reply.status_code for reply in before] == [200, 200], before[0].text
            assert before[0].json()["answer"]["graph_bytes"] > 0
            for wrong in (EXAMPLE_X.T.copy(), EXAMPLE_X.astype(np.float64)):  # the client's
                refused = asyncio.run(ask(["chain"], _body(wrong)))[0]  # fault: before any
                assert refused.status_code == 400, refused.text  # transform ran, still 400
                assert refused.json()["error"]["param"].startswith("inputs"), refused.text
            now = {name: _rewrite(bundles[name]) for name in ("f", "a")}
            after = asyncio.run(ask(["read", "chain", "read", "chain"]))
        for reply, bundle in zip(after, ["f", "a", "f", "a"], strict=True):
            assert reply.status_code == 503, reply.text
            assert reply.headers["x-should-retry"] == "false"
            assert "retry-after" not in reply.headers
            error = reply.json()["error"]
            manifest = str(bundles[bundle] / "edge-manifest.json")
            assert (error["type"], error["code"], error["param"]) == (
                "server_error", "bundle_changed", None)
            assert error["edge"]["kind"] == "BundleChanged"
            assert error["edge"]["field"] == manifest
            assert error["edge"]["reason"].startswith(
                f"rewritten since the stage opened with manifest sha256 {opened[bundle]}; ")
            assert error["message"].startswith(f"{manifest}: rewritten since ")
            assert error["message"].endswith(f"manifest sha256 now: {now[bundle]!r}")
        logged = [line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("edge serve: error: ")]
        assert [line.split(": rewritten since ")[0] for line in logged] == [
            f"edge serve: error: {bundles[name] / 'edge-manifest.json'}" for name in ("f", "a")]
        assert all(line.endswith("(answered 503; logged once per bundle)") for line in logged)
        assert ledger.holdings() == held
        assert _held(pipelines) == workers  # nothing held; the stages' workers still run
    finally:
        for pipeline in pipelines.values():
            pipeline.close()
    assert ledger.snapshot()["reservations"] == []


def _stage_up(text: str) -> dict[tuple[str, str], str]:
    """``edge_stage_up`` of a ``/metrics`` answer: (pipeline, stage) → the state at 1."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {family.name: family for family in text_string_to_metric_families(text)}
    up = {(sample.labels["pipeline"], sample.labels["stage"]): sample.labels["state"]
          for sample in families["edge_stage_up"].samples if sample.value == 1}
    assert len(up) == len(families["edge_stage_up"].samples)  # one state per stage
    return up


def test_health_is_503_naming_the_stage_whose_bundle_changed_until_it_loads_again(
        tmp_path: Path, ledger: ResourceLedger, capsys: pytest.CaptureFixture[str]) -> None:
    """ort-cpu stages verified in place; ``finish`` (pipeline ``read``) and a transform
    (pipeline ``chain``) read their bundle folders. Once the bundles of stages ``s`` and
    ``a`` are rewritten, every request reading them is 503 ``bundle_changed``, yet
    ``/health`` answered 200 ``ok``, every pipeline ``ready``: a load balancer kept
    sending traffic that could only fail. Now, once a request met it, ``/health`` is 503
    ``degraded``, each such pipeline ``degraded`` with ``bundle_changed`` naming the stage
    and the error's message (the stage's own state stays ``ready``: its worker serves),
    as ``GET /v1/pipelines/NAME`` and ``Pipeline.health()`` say; until the stage loads
    again: the bundles' bytes restored are not trusted as they are (written since the
    stage verified them: still 503), but once the stages restart (a new generation,
    verified again) ``/health`` is 200 and requests are answered. ``edge_stage_up`` on
    ``/metrics`` said ``ready`` for those stages all along; it says ``bundle-changed``
    while ``/health`` names them, ``ready`` again once they loaded again."""
    import shutil

    from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

    bundles = {name: write_add_relu_bundle(tmp_path / name) for name in ("f", "a", "b")}
    kept = {name: tmp_path / f"kept-{name}" for name in ("f", "a")}
    for name, copy in kept.items():
        shutil.copytree(bundles[name], copy)

    def stage(stage_id: str, bundle: str, **more: str) -> dict[str, Any]:
        return {"id": stage_id, "manifest": str(bundles[bundle]),
                "backend": {"name": "ort-cpu", "options": {"stage_bundle": False}}, **more}

    configs = {
        "read": {"name": "read", "finish": "bundle_finish:finish", "stages": [stage("s", "f")]},
        "chain": {"name": "chain", "stages": [
            stage("a", "a"), stage("b", "b", input_transform="edge_echo.transforms:read_tables")]},
    }
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    pipelines: dict[str, Pipeline] = {}
    body = _body(EXAMPLE_X)
    try:
        for name, config in configs.items():
            pipelines[name] = Pipeline.open(load_pipeline(config), plugins, ledger,
                                            retire_deadline_s=3.0)
        with ThreadPoolExecutor(4) as executor:
            served = {name: ServedPipeline(p, executor, private_upload_dir())
                      for name, p in pipelines.items()}
            app = build_app(ServerState(served, ledger, max_body_bytes=1 << 20))

            async def ask(*asked: str) -> list[httpx.Response]:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://edge") as client:
                    return [await client.post(f"/v1/pipelines/{path}/run", json=body)
                            if path in pipelines else await client.get(path)
                            for path in asked]

            health, scraped = asyncio.run(ask("/health", "/metrics"))
            assert health.status_code == 200, health.text
            assert {name: entry["bundle_changed"]
                    for name, entry in health.json()["pipelines"].items()} == {
                "read": {}, "chain": {}}
            assert _stage_up(scraped.text) == {("read", "s"): "ready", ("chain", "a"): "ready",
                                               ("chain", "b"): "ready"}
            for name in ("f", "a"):
                _rewrite(bundles[name])
            health, = asyncio.run(ask("/health"))  # nothing met it yet: not looked at
            assert health.status_code == 200, health.text
            answers = asyncio.run(ask("read", "chain", "/health", "/v1/pipelines/chain",
                                      "/metrics"))
            assert [reply.status_code for reply in answers] == [503, 503, 503, 200, 200]
            # edge_stage_up said ready for s and a, while /health was 503 naming them
            assert _stage_up(answers[4].text) == {("read", "s"): "bundle-changed",
                                                  ("chain", "a"): "bundle-changed",
                                                  ("chain", "b"): "ready"}
            messages = [reply.json()["error"]["message"] for reply in answers[:2]]
            health = answers[2].json()
            assert health["status"] == "degraded"
            listed = {name: (entry["state"], entry["stages"], entry["bundle_changed"])
                      for name, entry in health["pipelines"].items()}
            assert listed == {
                "read": ("degraded", {"s": "ready"}, {"s": messages[0]}),
                "chain": ("degraded", {"a": "ready", "b": "ready"}, {"a": messages[1]})}
            assert messages[1].startswith(f"{bundles['a'] / 'edge-manifest.json'}: rewritten")
            described = answers[3].json()
            assert (described["state"], described["bundle_changed"]) == (
                "degraded", {"a": messages[1]})
            report = pipelines["chain"].health()
            assert report["state"] == "degraded"
            assert report["stages"]["a"]["bundle_changed"] == {
                "type": "BundleChanged", "layer": report["stages"]["a"]["bundle_changed"][
                    "layer"], "message": messages[1]}
            assert report["stages"]["b"]["bundle_changed"] is None
            for name, copy in kept.items():  # the bundles as the stages opened them
                for member in copy.iterdir():
                    (bundles[name] / member.name).write_bytes(member.read_bytes())
            restored = asyncio.run(ask("read", "chain", "/health"))  # the same bytes, but
            # written since the stages verified them: only a new verification trusts them
            assert [reply.status_code for reply in restored] == [503, 503, 503]
            assert [reply.json()["error"]["code"] for reply in restored[:2]] == [
                "bundle_changed"] * 2
            pipelines["read"].stage("s").restart()
            pipelines["chain"].stage("a").restart()
            answers = asyncio.run(ask("/health", "read", "chain", "/metrics"))
            assert [reply.status_code for reply in answers] == [200, 200, 200, 200], \
                answers[0].text
            assert set(_stage_up(answers[3].text).values()) == {"ready"}
            assert all(not entry["bundle_changed"]
                       for entry in answers[0].json()["pipelines"].values())
            assert [s.generation for s in pipelines["chain"].stages] == [2, 1]
        capsys.readouterr()
    finally:
        for pipeline in pipelines.values():
            pipeline.close()
    assert ledger.snapshot()["reservations"] == []
