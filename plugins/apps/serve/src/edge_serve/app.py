"""The ASGI application: routes, guards and accounting around the served pipelines.

Routes:

====================================  =====================================================
``GET /``                             a page to upload an image to a pipeline with prepare
``GET /health``                       stage states, memory peaks vs demands; 200 all ready, else 503
``GET /metrics``                      Prometheus text (:mod:`edge_serve.metrics`)
``GET /v1/pipelines``                 each pipeline: stages, states, execution plan
``GET /v1/pipelines/{name}``          one of them
``POST /v1/pipelines/{name}/run``     JSON named tensors, or a multipart file for prepare
``GET /v1/models``                    generate pipelines, as OpenAI lists models
``POST /v1/completions``              OpenAI-compatible (:mod:`edge_serve.openai_api`)
``POST /v1/chat/completions``         OpenAI-compatible, ``messages`` templated in the worker
====================================  =====================================================
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Match, Route

from edge_core.errors import EdgeError
from edge_core.ledger import ResourceLedger
from edge_serve import openai_api
from edge_serve.bodies import (
    deadline_from,
    deadline_of,
    head_of,
    json_body,
    params_of,
    refuse_query,
)
from edge_serve.draining import Drain
from edge_serve.forms import quiet_parser_log, read_form
from edge_serve.guards import (
    DEFAULT_BODY_MIN_RATE,
    DEFAULT_BODY_TIMEOUT_S,
    App,
    BearerAuth,
    BodyLimit,
    BodyTimeout,
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    StalledBodies,
)
from edge_serve.metrics import CONTENT_TYPE, ServerMetrics
from edge_serve.outcomes import HttpRefusal, from_exception, outcome_of
from edge_serve.served import OUTCOME_KEY, ServedPipeline
from edge_serve.submitted import RequestHandle
from edge_serve.tensors import decode_tensors

__all__ = ["PIPELINE_KEY", "ROUTE_KEY", "RUN_PATH", "EdgeApp", "ServerState", "build_app"]

#: Scope keys a route fills in for the accounting: the pipeline and an outcome that the
#: status alone does not tell (a stream cut short by its client).
PIPELINE_KEY = "edge.pipeline"
ROUTE_KEY = "edge.route"

_RUN_KEYS = frozenset({"inputs", "params", "deadline_s"})

RUN_PATH = "/v1/pipelines/{name}/run"
"""The run route's path template (its label on ``/metrics``)."""

#: What answers an error a request raised: a handler ``(request, error) -> Response``.
Handler = Callable[[Request, Exception], Awaitable[Response]]


class ServerState:
    """What every route reads: pipelines by name, ledger, limits, metrics, and the drain.

    The drain ends the requests still open when the grace period ends (the pipelines'
    own, :mod:`edge_serve.draining`). ``plugin_errors`` are the plugins that did not load
    at start-up (``{"plugin", "error", "named_by"}``, as ``edge run --json`` lists them):
    ``/health`` shows them. ``max_body_bytes`` is the largest body a request may send
    (413 past it, ``--max-body-bytes``); ``body_timeout_s`` how long, in seconds, a route
    waits for more of a body before answering 408 and closing the connection
    (``--body-timeout``, default :data:`~edge_serve.guards.DEFAULT_BODY_TIMEOUT_S`:
    uvicorn bounds no body read of its own); ``body_min_rate`` how slowly, in bytes a
    second, a body may arrive once that many seconds have passed (``--body-min-rate``,
    default :data:`~edge_serve.guards.DEFAULT_BODY_MIN_RATE`). ``bodies`` are the
    requests waiting for more of their body, which the body guard notes and the
    connection cap reads (:class:`~edge_serve.guards.StalledBodies`).
    """

    def __init__(self, pipelines: Mapping[str, ServedPipeline], ledger: ResourceLedger,
                 *, max_body_bytes: int, drain: Drain | None = None,
                 plugin_errors: Sequence[Mapping[str, Any]] = (),
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 body_min_rate: int = DEFAULT_BODY_MIN_RATE) -> None:
        self.pipelines = dict(pipelines)
        self.plugin_errors = [dict(failure) for failure in plugin_errors]
        self.ledger = ledger
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.body_min_rate = body_min_rate
        self.bodies = StalledBodies(body_timeout_s, body_min_rate)
        self.drain = drain if drain is not None else Drain()
        self.metrics = ServerMetrics(ledger, lambda: self.pipelines.values())
        for served in self.pipelines.values():
            served.queue.observer = self.metrics.observe_queue

    def pipeline(self, name: str, request: Request) -> ServedPipeline:
        """The served pipeline ``name`` (404 otherwise); labels the request with it."""
        served = self.pipelines.get(name)
        if served is None:
            raise HttpRefusal(404, "name", f"no such pipeline (serving: "
                              f"{', '.join(sorted(self.pipelines))})", name, kind="NotFound")
        request.scope[PIPELINE_KEY] = name
        return served


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.edge
    return state


class Accounting:
    """Outermost middleware: counts every request by outcome, with its latency.

    ``routes`` are the application's, in the router's order: a request refused before
    routing is labelled with the one its path matches (:meth:`_unrouted_label`).

    ``on_error``, where given, answers an error that reached it (no handler of a layer
    within took it) as Starlette's ``ServerErrorMiddleware`` does one layer out: its
    response is sent unless one was begun, the error raised on for the server to log,
    and the request counted 500 (the run route's own stack, :class:`EdgeApp`, which has no
    ``ServerErrorMiddleware`` around it).
    """

    def __init__(self, app: App, metrics: ServerMetrics, names: frozenset[str],
                 routes: Sequence[Route] = (), on_error: Handler | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.names = names
        self.routes = tuple(routes)
        self.on_error = on_error

    def _pipeline(self, scope: Scope) -> str:
        """The pipeline a request was for, as its route set it.

        A request refused before routing (401, 413) is counted under NAME when its path is
        ``/v1/pipelines/NAME/...`` and NAME is served (any other name counts as none).
        """
        named = scope.get(PIPELINE_KEY)
        if named is not None:
            return str(named)
        parts = str(scope.get("path", "")).split("/")
        if len(parts) > 3 and parts[1:3] == ["v1", "pipelines"] and parts[3] in self.names:
            return parts[3]
        return ""

    def _unrouted_label(self, scope: Scope) -> str:
        """The route label of a request the router never labelled; ``"other"`` if none.

        A request refused before routing (401, 413) gets the path template of the route its
        path matches, chosen as the router would (a full match first, else the first whose
        path matches but not its method); the routes are only matched, never run. Called
        only when the label would otherwise be ``"other"``.
        """
        partial: str | None = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route.path
            if match is Match.PARTIAL and partial is None:
                partial = route.path
        return partial or "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0  # none sent: counted 500

        async def observing_send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        except Exception as exc:
            if self.on_error is not None and not status:  # (counted 500, as it was)
                response = await self.on_error(Request(scope), exc)
                await response(scope, receive, send)
            raise
        finally:
            route = scope.get("route")
            label = (scope.get(ROUTE_KEY) or getattr(route, "path", None)
                     or self._unrouted_label(scope))
            outcome = scope.get(OUTCOME_KEY) or outcome_of(status or 500)
            named = scope.get(PIPELINE_KEY)  # as its route set it (else _pipeline finds it)
            self.metrics.observe_request(self._pipeline(scope) if named is None else str(named),
                                         label, outcome, time.perf_counter() - started)


class JSONBytes(Response):
    """A 200 answer of JSON already rendered.

    With the headers Starlette's ``Response`` gives it (``content-length``,
    ``content-type: application/json``), made without its search for which to add.
    """

    media_type = "application/json"

    def __init__(self, content: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = content
        self.raw_headers = [(b"content-length", str(len(content)).encode("latin-1")),
                            (b"content-type", b"application/json")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send it: what ``Response.__call__`` sends an HTTP request, without its checks."""
        if scope["type"] != "http":  # (a websocket's denial: Response wraps its send)
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def refusal_response(refusal: HttpRefusal) -> Response:
    """A refusal as a JSON response."""
    return Response(refusal.body(), status_code=refusal.status, headers=refusal.headers,
                    media_type="application/json")


async def _on_refusal(request: Request, exc: Exception) -> Response:
    return refusal_response(from_exception(exc))


async def _on_disconnect(request: Request, exc: Exception) -> Response:
    """A client that went away before its body was read: 499 (counted ``cancelled``).

    Nobody reads the answer; nothing reached a stage, and it is not the server's error
    (no 500, nothing logged).
    """
    return refusal_response(HttpRefusal(
        499, "body", "the client disconnected before its body was read",
        kind="ClientDisconnected"))


# -- routes ----------------------------------------------------------------------------------


async def page(request: Request) -> Response:
    """The upload page (static; it calls the API from the browser)."""
    html = resources.files("edge_serve").joinpath("page.html").read_text(encoding="utf-8")
    return HTMLResponse(html)


async def health(request: Request) -> Response:
    """Every stage's state and memory peak against its demand; 503 while any is not ready.

    A stage whose bundle changed since it loaded (``BundleChanged`` met by a ``finish``
    or transform reading its folder) makes its pipeline not ready although its worker
    serves: listed in the pipeline's ``bundle_changed`` (stage id → the error's message)
    until the stage loads again or the server is started again.

    A stage whose peak exceeds its declared demand still serves (the status stays
    ``ok``); it is listed in ``memory_over_demand`` as ``pipeline/stage``. Every plugin
    that did not load at start-up is listed in ``plugin_errors`` by name and who named it
    (the status stays ``ok``: each pipeline opened without it). Not its error: this route
    needs no key, and an import error may name a file on the server; the operator has
    it on the server's standard error and in the closing summary.
    """
    state = _state(request)
    pipelines = {}
    ready = True
    over: list[str] = []
    for name, served in state.pipelines.items():
        stages = served.stage_states()
        changed = served.bundles_changed()
        up = served.ready()  # (edge_stage_up reads the same readiness)
        ready = ready and up
        report = served.pipeline.health()
        memory = report["memory"]  # each stage's peak so far vs demand
        over += [f"{name}/{stage}" for stage in memory["over_demand"]]
        pipelines[name] = {"state": "ready" if up else "degraded", "stages": stages,
                           "bundle_changed": changed, "placement": report["placement"],
                           "memory": memory}
    body = {"status": "ok" if ready else "degraded", "memory_over_demand": over,
            "plugin_errors": [{"plugin": failure["plugin"], "named_by": failure.get("named_by")}
                              for failure in state.plugin_errors],
            "pipelines": pipelines}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def list_pipelines(request: Request) -> Response:
    """Each pipeline with its stages, their states and the execution plan."""
    state = _state(request)
    return JSONResponse({"pipelines": [s.describe() for s in state.pipelines.values()]})


async def show_pipeline(request: Request) -> Response:
    """One pipeline."""
    state = _state(request)
    return JSONResponse(state.pipeline(request.path_params["name"], request).describe())


async def run_pipeline(request: Request, state: ServerState | None = None) -> Response:
    """Run one request: JSON tensors, or a multipart file for the pipeline's prepare.

    Refuses a query string itself (:func:`refuse_query`), as :func:`_without_query`'s
    wrapper does for the other routes: the busiest route awaits no wrapper. ``state`` is
    the application's (:class:`RunRoute` holds it: not looked up on every request).
    """
    scope = request.scope
    if scope.get("query_string"):  # (refuse_query's own check, without its call)
        refuse_query(request)
    if state is None:
        state = _state(request)
    served = state.pipeline(scope["path_params"]["name"], request)
    content_type, deadline_header = head_of(request)
    if content_type.lower().startswith("multipart/form-data"):
        return await _run_file(request, served, state)
    body = await json_body(request, _RUN_KEYS, content_type)
    deadline_s = body.get("deadline_s")
    deadline = None if deadline_header is None and deadline_s is None \
        else deadline_from(deadline_header, deadline_s)
    params = body.get("params")
    if params is not None:  # (none: nothing to read or refuse)
        params = params_of(params)
        served.refuse_unread_params(params)
    inputs = decode_tensors(body.get("inputs", {}), "inputs", max_bytes=state.max_body_bytes)
    served.require_ready()
    handle = RequestHandle(served.name)
    answer = await served.answer_direct(request, handle, inputs, params, deadline)
    state.metrics.observe_stages(served.name, answer.latencies)
    return JSONBytes(answer.content)


class RunRoute:
    """The run route as an ASGI application: :func:`run_pipeline` over one ``state``.

    What Starlette's ``request_response`` makes of an endpoint function, with the
    application's ``ExceptionMiddleware`` inside it: an error :func:`run_pipeline` raises
    is answered here by the handler the application holds for it (:func:`handled`), and
    one no handler takes is raised on (the server's 500). Reached through Starlette's
    router, or directly (:class:`EdgeApp`), it answers the same.
    """

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await run_pipeline(request, self.state)
        except Exception as exc:
            response = await handled(request, exc)
        await response(scope, receive, send)


async def _run_file(request: Request, served: ServedPipeline, state: ServerState) -> Response:
    try:
        form = await read_form(request, max_files=1, max_fields=8)
    except (HttpRefusal, BodyTooLarge, BodyTimeout, ClientDisconnect):
        raise
    except Exception as exc:  # anything else the parser raised on this body
        raise HttpRefusal(400, "body", "not a valid multipart form",
                          f"{type(exc).__name__}: {exc}", kind="InvalidMultipart") from None
    try:
        unknown = sorted(set(form.keys()) - {"file", "params", "deadline_s"})
        if unknown:
            raise HttpRefusal(400, unknown[0], "unknown form field (known: deadline_s, file, "
                              "params)", kind="InvalidValue")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise HttpRefusal(400, "file", "a multipart upload needs a file field",
                              type(upload).__name__ if upload is not None else None,
                              kind="InvalidValue")
        deadline = deadline_of(request, form.get("deadline_s"), form=True)
        params = params_of(form.get("params"))
        served.refuse_unread_params(params)
        served.refuse_file("file")
        data = await upload.read()
        suffix = _suffix(upload.filename)
    finally:
        await form.close()
    served.require_ready()
    handle = RequestHandle(served.name)
    answer = await served.within(
        request, handle, lambda until: served.answer_file(data, suffix, params, until, handle),
        deadline)
    state.metrics.observe_stages(served.name, answer.latencies)
    return JSONBytes(answer.content)


def _suffix(filename: str | None) -> str:
    """The upload's extension when it is short and plain (Pillow does not need it)."""
    if not filename or "." not in filename:
        return ""
    ext = filename.rsplit(".", 1)[1]
    return f".{ext.lower()}" if ext.isalnum() and len(ext) <= 8 else ""


async def not_found(request: Request, exc: Exception) -> Response:
    """404 (or 405, with the route's ``Allow`` header) in the server's JSON error form."""
    status = int(getattr(exc, "status_code", 404))
    headers = {k: v for k, v in (getattr(exc, "headers", None) or {}).items()
               if k.lower() == "allow"}
    return refusal_response(HttpRefusal(status, "path", "no such route" if status == 404
                                        else f"method {request.method} not allowed",
                                        request.url.path, headers=headers,
                                        kind="NotFound" if status == 404 else "BadMethod"))


#: The handlers of errors a route raises, by their type (the nearest in its MRO): the
#: application's ``ExceptionMiddleware`` holds them, and :func:`handled` reads them.
HANDLERS: dict[type[Exception], Handler] = {
    HttpRefusal: _on_refusal, EdgeError: _on_refusal, ValueError: _on_refusal,
    ClientDisconnect: _on_disconnect}
#: The handlers of Starlette's ``HTTPException`` by its status (the router's 404 and 405).
STATUS_HANDLERS: dict[int, Handler] = {404: not_found, 405: not_found}


async def handled(request: Request, error: Exception) -> Response:
    """The response the application's ``ExceptionMiddleware`` gives ``error``.

    Its handler by status for an ``HTTPException`` (else Starlette's plain answer), else
    the handler of the nearest type in the error's MRO (:data:`HANDLERS`); an error none
    takes is raised on, to the server's 500 (``ServerErrorMiddleware``, or
    :class:`Accounting`'s ``on_error``). Called within the ``except`` that caught it.
    """
    handler: Handler | None = None
    if isinstance(error, HTTPException):
        handler = STATUS_HANDLERS.get(error.status_code)
        if handler is None:
            if error.status_code in {204, 304}:
                return Response(status_code=error.status_code, headers=error.headers)
            return PlainTextResponse(error.detail, status_code=error.status_code,
                                     headers=error.headers)
    else:
        for kind in type(error).__mro__:
            handler = HANDLERS.get(kind)
            if handler is not None:
                break
        else:
            raise error
    response = await handler(request, error)
    error.__traceback__ = None  # (as Starlette does: a reused error's traceback grows)
    return response


class EdgeApp(Starlette):
    """The Starlette application, whose busiest route is taken before its router.

    ``POST /v1/pipelines/NAME/run`` (NAME without a slash, no ``root_path``) goes straight
    to :attr:`run`: the same guards (:class:`Accounting`, :class:`BearerAuth` where a key
    is set, :class:`BodyLimit`) around the same :class:`RunRoute`, whose errors the same
    handlers answer (:func:`handled`), and :class:`Accounting`'s ``on_error`` in place of
    ``ServerErrorMiddleware``; the scope gets what the route and its label read of what
    the router would give it (``app``, ``route``, ``path_params``). Nothing else can match that
    path and method: every other request (another method on it, a slash more or less, a
    name with a slash) goes through Starlette's middleware and router as before. A
    request pays no router's walk over the routes, no ``ServerErrorMiddleware``, no
    ``ExceptionMiddleware`` and their wrappers of ``send``.
    """

    def __init__(self, *, run: App, run_route: Route, **starlette: Any) -> None:
        """``run``: the run route's own stack; ``run_route``: its route (in ``routes``)."""
        super().__init__(**starlette)
        self.run = run
        self.run_route = run_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The run route's own stack for its requests; Starlette's for every other."""
        if scope["type"] == "http" and scope["method"] == "POST" \
                and not scope.get("root_path"):
            path: str = scope["path"]
            if path[:14] == "/v1/pipelines/" and path[-4:] == "/run":
                name = path[14:-4]
                if name and "/" not in name:
                    scope["app"] = self
                    scope["route"] = self.run_route
                    scope["path_params"] = {"name": name}
                    await self.run(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


Endpoint = Callable[[Request], Awaitable[Response]]


def _without_query(route: Route) -> Route:
    """``route`` whose endpoint first refuses a query string (:func:`refuse_query`).

    Checked once the route and its method matched: a path no route serves is still 404,
    a method it does not serve 405.
    """
    endpoint: Endpoint = route.endpoint

    @functools.wraps(endpoint)
    async def checked(request: Request) -> Response:
        refuse_query(request)
        return await endpoint(request)

    return Route(route.path, checked, methods=sorted(route.methods or ()), name=route.name)


def build_app(state: ServerState, *, api_key: str | None = None) -> EdgeApp:
    """The Starlette application over ``state`` (:class:`EdgeApp`)."""
    run = RunRoute(state)
    run_route = Route(RUN_PATH, run, methods=["POST"], name="run_pipeline")
    routes = [  # matched in order: the request route first (no two paths overlap)
        run_route,  # refuses a query itself
        *(_without_query(route) for route in (
            Route("/", page, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/pipelines", list_pipelines, methods=["GET"]),
            Route("/v1/pipelines/{name}", show_pipeline, methods=["GET"]),
            *openai_api.routes(),
        ))]
    middleware = [Middleware(Accounting, metrics=state.metrics,
                             names=frozenset(state.pipelines), routes=routes)]
    if api_key:
        middleware.append(Middleware(BearerAuth, api_key=api_key))
    middleware.append(Middleware(BodyLimit, max_bytes=state.max_body_bytes,
                                 timeout_s=state.body_timeout_s,
                                 min_rate=state.body_min_rate,
                                 on_timeout=state.metrics.count_body_timeout,
                                 stalls=state.bodies))
    # The run route's own stack: the middleware above, in the same order, around it
    direct: App = BodyLimit(run, max_bytes=state.max_body_bytes,
                            timeout_s=state.body_timeout_s, min_rate=state.body_min_rate,
                            on_timeout=state.metrics.count_body_timeout, stalls=state.bodies)
    if api_key:
        direct = BearerAuth(direct, api_key=api_key)
    direct = Accounting(direct, metrics=state.metrics, names=frozenset(state.pipelines),
                        routes=routes, on_error=_on_refusal)
    app = EdgeApp(run=direct, run_route=run_route, routes=routes, middleware=middleware,
                  exception_handlers={**HANDLERS, **STATUS_HANDLERS,
                                      # anything else: a JSON 500, and uvicorn logs it
                                      Exception: _on_refusal})
    # A path no route serves is 404 in the server's JSON form, a route's path with a slash
    # added (or taken away) too: never Starlette's redirect, an empty 307 whose Location
    # echoes the request's Host header.
    app.router.redirect_slashes = False
    app.state.edge = state
    quiet_parser_log()  # a malformed upload is answered with its 400, not logged
    return app

