"""``edge serve PIPELINE...``: open the pipelines, serve HTTP until a signal, close them.

Order of things: every pipeline file is read and checked (names unique) → the plugins
they need are loaded once (those that did not load are warned about when named, and
listed as ``plugin_errors`` in ``/health``, the closing summary and a failure's JSON, and
by name on the ``listening on`` line) → one ledger for all of them (:func:`shared_ledger`) → each
pipeline is opened as ``edge run`` opens it (admitted, loaded, gated; a failure closes
those already open) → the socket is bound (127.0.0.1 unless ``--host`` says otherwise;
``--port 0`` takes a free port) and ``edge serve: listening on http://HOST:PORT`` is
printed → uvicorn serves until SIGINT or SIGTERM → it stops accepting and lets running
requests finish (``--grace``); when the grace period ends, every request still open is
answered by its route (a stream with an SSE error event, then ``[DONE]``; see
:mod:`edge_serve.draining`) → work still in flight is cancelled → every pipeline is closed
with verified retirement, the pipelines in parallel → the closing summary is printed (JSON
with ``--json``): each pipeline's close, each stage's retire time (``retire_s``) and how
long closing took (``closing_s``).

Exit codes: 0 every worker retired verified and the ledger empty; 1 a pipeline failed to
open, or something was left (quarantined, unverified); 2 usage or configuration error.

The workers' output (a runtime's warnings, a traceback) goes to a log folder, as ``edge
run``'s does (:func:`edge_core.cli.common.worker_logs`), not between the server's own
lines: ``edge: worker logs: DIR`` is printed on stderr before the first pipeline opens, and
the folder is ``worker_logs`` in the closing summary and in a failure's JSON;
``--verbose`` shows the output on stderr instead (``worker_logs`` is then null).
``EDGE_WORKER_LOG_DIR`` names a folder to use instead of a fresh one. A fresh folder is
removed at exit, its logs with it, when every worker's log stayed empty and the server
exits 0; after a failure it is kept (:func:`edge_core.cli.common.end_worker_logs`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from edge_core import discovery
from edge_core.cli import common

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edge_core.runtime.pipeline import Pipeline
    from edge_serve.connections import CappedListener, ConnectionCap
    from edge_serve.draining import Drain
    from edge_serve.heads import SlowHeads
    from edge_serve.open_files import OpenFileLimit

__all__ = ["NAME", "register", "serve"]

NAME = "serve"
DEFAULT_MAX_BODY = 32 * 1024 * 1024
API_KEY_ENV = "EDGE_API_KEY"
MAX_PORT = 65535
"""The highest TCP port (a larger --port is refused by name before any pipeline opens)."""


class Stopped(BaseException):
    """SIGTERM arrived while the pipelines were opening."""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``serve`` command."""
    parser = common.add_command(
        sub, NAME, "serve pipelines over a local HTTP API (OpenAI-compatible for generation)",
        "Check every pipeline file, open each pipeline as 'edge run' does (admitted on one "
        "shared ledger, loaded, gated) and serve them on HTTP until SIGINT or SIGTERM, then "
        "close them with verified retirement. POST /v1/pipelines/NAME/run takes a file "
        "upload or named tensors; a generate pipeline also answers /v1/completions and "
        "/v1/chat/completions. Exit 0 when everything closed clean, 1 when a pipeline "
        "failed to open or something was left, 2 for a usage or configuration problem "
        "(every problem of every file named at once, before any worker starts). Plugins "
        "that did not load are listed as plugin_errors in GET /health, the closing summary "
        "and a failure's JSON. The workers' output goes to a log folder, named on stderr "
        "and as worker_logs in the closing summary; --verbose shows it on stderr instead.",
        "edge serve build/ocr/pipeline.toml",
        "edge serve build/ocr/pipeline.toml --port 0 --api-key secret",
        "curl -F file=@build/ocr/page.png http://127.0.0.1:8000/v1/pipelines/ocr-page/run")
    common.add_json_flag(parser)
    common.add_verbose_flag(parser)
    parser.add_argument("pipelines", nargs="+", metavar="PIPELINE",
                        help="pipeline files (.toml, .yaml, .json); each is served under its "
                        "name")
    parser.add_argument("--host", default="127.0.0.1", metavar="HOST",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=common.int_between(0, MAX_PORT), default=8000,
                        metavar="PORT",
                        help="port to bind, 0 to 65535 (default 8000; 0 takes a free one)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every route but /health "
                        f"and the page (default: ${API_KEY_ENV}, else none)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY, metavar="N",
                        help=f"refuse request bodies over N bytes with 413 (default "
                        f"{DEFAULT_MAX_BODY // 2**20} MiB = {DEFAULT_MAX_BODY})")
    parser.add_argument("--body-timeout", type=float, default=None, metavar="SECONDS",
                        help="answer 408 and close the connection when no more of a request's "
                        "body arrived for SECONDS (a body shorter than its Content-Length, a "
                        "client that stopped sending; counted from each wait), or when the "
                        "body is not complete SECONDS after the request's head and one "
                        "second more for each --body-min-rate bytes received; default 30, "
                        "above 0, at most 3600")
    parser.add_argument("--body-min-rate", type=int, default=None, metavar="BYTES",
                        help="the slowest a request's body may arrive after its first "
                        "--body-timeout seconds, in bytes a second: slower is answered 408 "
                        "and the connection closed (a client trickling its body to hold the "
                        "connection); default 500 (4 kbit/s, as Apache's mod_reqtimeout), "
                        "1 to 1073741824")
    parser.add_argument("--header-timeout", type=float, default=None, metavar="SECONDS",
                        help="close a connection that has not sent a whole request head "
                        "(request line and headers) within SECONDS of its opening or of the "
                        "end of its last answer, with 408 when part of one arrived (a client "
                        "that trickles its head, or an idle one); default 10, above 0, at "
                        "most 3600")
    parser.add_argument("--max-connections", type=common.positive_int, default=None,
                        metavar="N",
                        help="the most connections open at once; past it a new one closes "
                        "the one that has waited longest for a request (idle), or is closed "
                        "at once when every one has a request running (default: what the "
                        "open-file limit holds once the pipelines are open, two files a "
                        "connection, after the server's own, 64 spare and one a request "
                        "thread; the soft limit is raised to the hard one, at most 65536, "
                        "at start). More than the limit holds is refused (exit 2)")
    parser.add_argument("--queue-length", action="append", default=[], metavar="N",
                        help="requests that may wait for a pipeline's admission when it is "
                        "full (default 64; 0: refuse at once); NAME=N for pipeline NAME only; "
                        "repeatable. A request past it gets 429 with Retry-After")
    parser.add_argument("--queue-wait", action="append", default=[], metavar="SECONDS",
                        help="longest wait for admission of a request without a shorter "
                        "deadline (default 30); NAME=SECONDS for pipeline NAME only; repeatable. "
                        "One that passes while waiting gets 504")
    parser.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                        help="on a signal, let running requests finish for SECONDS before "
                        "they are cancelled (default 10)")
    parser.set_defaults(func=serve)


def _configs(paths: list[str]) -> list[Any]:
    """Every file checked against the installed plugins; all their problems at once.

    A refusal's document lists every plugin that did not load while the files were
    checked (``plugin_errors``), and the ones named are warned about, as ``edge run``
    does for its one file.
    """
    from pathlib import Path

    from edge_core.config import folder_problem
    from edge_core.errors import ConfigError
    from edge_core.preflight import check_pipeline

    configs = []
    failures = []
    rows: list[dict[str, Any]] = []

    def loaded(plugins: Any) -> None:
        rows.extend(r for r in (record.to_json() for record in plugins.records)
                    if r not in rows)  # each file loads the plugins: each row once

    for path in paths:
        try:
            if os.path.basename(path) == "pyproject.toml":
                raise _pyproject_not_served(path)
            if os.path.isdir(path):  # not the loader's words: they offer --name
                raise ConfigError("source", folder_problem(Path(path), pyproject=False), path)
            configs.append(check_pipeline(path, loaded=loaded).config)
        except ConfigError as exc:
            failures.append(common.config_failure(exc, path))
    if failures:
        common.warn_named_plugins(rows)
        raise common.CommandFailed(common.EXIT_USAGE, "; ".join(f.message for f in failures),
                                   {"problems": [p for f in failures
                                                 for p in f.body["problems"]],
                                    "plugin_errors": discovery.plugin_errors(rows)})
    seen: set[str] = set()
    for index, config in enumerate(configs):
        if config.name in seen:
            raise common.CommandFailed(common.EXIT_USAGE, f"pipelines[{index}].name: served "
                                       f"twice: {config.name!r}")
        seen.add(config.name)
    return configs


def _pyproject_not_served(path: str) -> Any:
    """Why a ``pyproject.toml`` is refused: serve takes pipeline files, and has no --name.

    ``check_pipeline`` would ask for ``--name``, an option ``edge run`` has and this
    command has not; the refusal names the pipelines the file defines and what to do.
    """
    from edge_core.config import pyproject_pipelines
    from edge_core.errors import ConfigError

    listed = pyproject_pipelines(path)
    return ConfigError("PIPELINE", "edge serve takes pipeline files (.toml, .yaml, .json), "
                       f"not a pyproject.toml's [tool.edge.pipelines] ({listed}): write the "
                       "pipeline's table to a file of its own (the same keys, with its name)")


def _per_pipeline(values: list[str], flag: str, names: list[str],
                  parse: Any) -> dict[str | None, Any]:
    """``[NAME=]VALUE`` options: None → the value for every pipeline, NAME → its own."""
    found: dict[str | None, Any] = {}
    for given in values:
        name, _, text = given.rpartition("=")
        key = name or None
        if key is not None and key not in names:
            raise common.CommandFailed(common.EXIT_USAGE, f"{flag}: no pipeline named "
                                       f"{key!r} is served ({', '.join(names)}): {given}")
        try:
            found[key] = parse(text)
        except ValueError:
            raise common.CommandFailed(common.EXIT_USAGE, f"{flag}: not a number: "
                                       f"{given}") from None
    return found


def queue_policies(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Each pipeline's admission queue from ``--queue-length`` and ``--queue-wait``."""
    from edge_serve.queueing import DEFAULT_LENGTH, DEFAULT_WAIT_S, QueuePolicy

    lengths = _per_pipeline(args.queue_length, "--queue-length", names, int)
    waits = _per_pipeline(args.queue_wait, "--queue-wait", names, float)
    policies = {}
    for name in names:
        length = lengths.get(name, lengths.get(None, DEFAULT_LENGTH))
        wait = waits.get(name, waits.get(None, DEFAULT_WAIT_S))
        try:
            policies[name] = QueuePolicy(length, wait)
        except ValueError as exc:
            flag = "--queue-length" if "length" in str(exc) else "--queue-wait"
            raise common.CommandFailed(common.EXIT_USAGE, f"{flag}: {exc}") from None
    return policies


def _unwind_on_sigterm() -> None:
    """While opening: SIGTERM unwinds like Ctrl-C does (opening retires what it started).

    Left in place until :meth:`_Server.stop_on_signals` replaces it, so that no moment is
    left where SIGTERM would end the process without closing the pipelines.
    """
    def stop(signum: int, frame: object) -> None:
        raise Stopped

    signal.signal(signal.SIGTERM, stop)


def _open(configs: list[Any], say: Any,
          plugin_errors: list[dict[str, Any]]) -> tuple[Any, list[Pipeline]]:
    """Load the plugins once, then open every pipeline on one ledger; the ledger and them.

    ``plugin_errors`` is filled with every plugin that did not load
    (:func:`~edge_core.discovery.plugin_errors`); a failure to open carries it too.
    """
    from edge_core.errors import ConfigError, EdgeError
    from edge_core.plugins import load_plugins
    from edge_core.runtime.pipeline import Pipeline
    from edge_core.runtime.pipeline_files import refuse_unknown_pools, shared_ledger

    modules = sorted({m for config in configs for m in config.plugins})
    plugins = load_plugins(local_modules=modules)
    rows = [record.to_json() for record in plugins.records]
    common.warn_named_plugins(rows)
    plugin_errors.extend(discovery.plugin_errors(rows))
    ledger = shared_ledger(configs, plugins)
    failures = []
    for config in configs:  # a sole backend's demand on an unknown pool: before any opens
        try:
            refuse_unknown_pools(config, ledger)
        except ConfigError as exc:
            failures.append(common.config_failure(
                exc, str(config.source) if config.source is not None else None))
    if failures:
        raise common.CommandFailed(common.EXIT_USAGE, "; ".join(f.message for f in failures),
                                   {"problems": [p for f in failures
                                                 for p in f.body["problems"]],
                                    "plugin_errors": plugin_errors})
    opened: list[Pipeline] = []
    source = ""
    try:
        for config in configs:
            source = f"{config.source}: " if config.source is not None else ""
            say(f"opening pipeline {config.name}")
            opened.append(Pipeline.open(config, plugins, ledger, progress=say))
    except (EdgeError, ValueError) as exc:
        for pipeline in reversed(opened):
            pipeline.close()
        # a configuration problem found as it opens (a demand on a pool no backend
        # reports) is the file's, as `edge run` says: exit 2, the file and problem named
        if isinstance(exc, ConfigError):
            raise common.CommandFailed(common.EXIT_USAGE,
                                       f"{source}{type(exc).__name__}: {exc.located}",
                                       {"plugin_errors": plugin_errors}) from exc
        raise common.CommandFailed(common.EXIT_FAILED, f"{type(exc).__name__}: {exc}",
                                   {"plugin_errors": plugin_errors}) from exc
    except BaseException:
        for pipeline in reversed(opened):
            pipeline.close()
        raise
    return ledger, opened


def _not_loaded(plugin_errors: list[dict[str, Any]]) -> str:
    """What the ``listening on`` line adds about plugins that did not load ('' if none)."""
    if not plugin_errors:
        return ""
    names = ", ".join(failure["plugin"] for failure in plugin_errors)
    return f"; plugins that did not load: {names} (GET /health lists them as plugin_errors)"


def _bind(host: str, port: int) -> CappedListener:
    """The listening socket: its accept() keeps to the connection cap once it is set."""
    from edge_serve.connections import CappedListener

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY on accepted connections only
    # when the listening socket says TCP; with proto 0 every response waited on the
    # client's delayed ACK (~40 ms a request).
    sock = CappedListener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise common.CommandFailed(common.EXIT_USAGE, f"--host/--port: cannot bind: "
                                   f"{exc.strerror}: {host}:{port}") from exc
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _max_connections(asked: int | None, limit: OpenFileLimit, threads: int) -> int:
    """``--max-connections``, else what the open-file limit holds (more: exit 2).

    Counted once the pipelines are open: the files the server holds then (their
    channels among them), ``SPARE_FILES`` more and one for each request thread
    (``threads``) are kept free, and each connection may hold two. A refusal names
    these figures.
    """
    from edge_serve.connections import SPARE_FILES, connection_room
    from edge_serve.open_files import OPEN_FILES_CEILING, files_in_use

    in_use = files_in_use() or 0
    spare = SPARE_FILES + threads
    if limit.soft is None:  # no limit to keep to (Windows, or unlimited)
        return asked if asked is not None else connection_room(OPEN_FILES_CEILING, in_use,
                                                               spare)
    room = connection_room(limit.soft, in_use, spare)
    held = (f"the open-file limit is {limit.soft} (hard {limit.hard or 'unlimited'}), "
            f"{in_use} held by the server and its pipelines' channels, {spare} kept spare, "
            f"2 a connection")
    if asked is None and room < 1:
        raise common.CommandFailed(common.EXIT_USAGE, f"--max-connections: no connection "
                                   f"fits: {held}; raise the limit (ulimit -n)")
    if asked is not None and asked > room:
        raise common.CommandFailed(common.EXIT_USAGE, f"--max-connections: at most "
                                   f"{max(room, 0)} fit: {held}; raise the limit (ulimit "
                                   f"-n) or ask for fewer: {asked}")
    return asked if asked is not None else room


def _files_line(limit: OpenFileLimit, max_connections: int) -> str:
    """The start-up line about the open-file limit and the connection cap."""
    if limit.soft is None:
        files = "no open-file limit to raise"
    elif limit.raised:
        files = (f"open-file limit raised from {limit.before} to {limit.soft} (hard "
                 f"{limit.hard or 'unlimited'})")
    else:
        files = f"open-file limit {limit.soft} (hard {limit.hard or 'unlimited'})"
    return f"{files}; at most {max_connections} connections (--max-connections)"


def _cancel_all(pipelines: list[Pipeline]) -> dict[str, Any]:
    """Cancel what still runs once the server has stopped (its answers go nowhere)."""
    summary: dict[str, Any] = {}
    for pipeline in pipelines:
        try:
            pipeline.cancel()
        except Exception as exc:  # closing still follows
            summary.setdefault("cancel_errors", {})[pipeline.config.name] = str(exc)
    return summary


def _close_all(pipelines: list[Pipeline]) -> dict[str, Any]:
    """Close every pipeline, all at once (each retires its stages in reverse order)."""
    if not pipelines:
        return {}
    with ThreadPoolExecutor(max_workers=len(pipelines),
                            thread_name_prefix="edge-serve-close") as pool:
        futures = {p.config.name: pool.submit(p.close) for p in pipelines}
    return {name: future.result() for name, future in futures.items()}


def _retire_times(closed: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Pipeline → stage → seconds its worker tree took to retire (None: no worker)."""
    times: dict[str, dict[str, float | None]] = {}
    for name, summary in closed.items():
        for stage, entry in summary.items():
            retire = entry.get("retire")
            elapsed = retire.get("elapsed_s") if isinstance(retire, dict) else None
            times.setdefault(name, {})[stage] = elapsed
    return times


def serve(args: argparse.Namespace) -> int:
    """Open the pipelines, serve until SIGINT/SIGTERM, close them; the closing summary."""
    from edge_contracts.heap import (
        HEAP_ENV,
        HEAP_POLICIES,
        apply_heap_policy,
        unknown_heap_policy,
    )

    if (unknown := unknown_heap_policy()) is not None:  # before anything opens or binds
        raise common.CommandFailed(common.EXIT_USAGE, f"{HEAP_ENV}: names no heap policy (one "
                                   f"of {', '.join(HEAP_POLICIES)}; unset means rest): "
                                   f"{unknown!r}")
    apply_heap_policy()  # before any thread allocates: one heap, given back at rest
    import uvicorn

    from edge_serve.app import ServerState, build_app
    from edge_serve.connections import ConnectionCap
    from edge_serve.draining import UVICORN_MARGIN_S, Drain
    from edge_serve.guards import (
        DEFAULT_BODY_MIN_RATE,
        DEFAULT_BODY_TIMEOUT_S,
        MAX_BODY_MIN_RATE,
        MAX_TIMEOUT_S,
    )
    from edge_serve.heads import DEFAULT_HEADER_TIMEOUT_S, SlowHeads, bounded_protocol
    from edge_serve.open_files import raise_open_file_limit
    from edge_serve.served import ServedPipeline, private_upload_dir

    if args.max_body_bytes < 1:
        raise common.CommandFailed(common.EXIT_USAGE, f"--max-body-bytes: must be at least 1: "
                                   f"{args.max_body_bytes}")
    body_timeout = DEFAULT_BODY_TIMEOUT_S if args.body_timeout is None else args.body_timeout
    header_timeout = (DEFAULT_HEADER_TIMEOUT_S if args.header_timeout is None
                      else args.header_timeout)
    for option, seconds in (("--body-timeout", body_timeout),
                            ("--header-timeout", header_timeout)):
        if not 0.0 < seconds <= MAX_TIMEOUT_S:
            raise common.CommandFailed(common.EXIT_USAGE, f"{option}: must be a number of "
                                       f"seconds > 0 and <= {MAX_TIMEOUT_S:g}: {seconds}")
    body_min_rate = (DEFAULT_BODY_MIN_RATE if args.body_min_rate is None
                     else args.body_min_rate)
    if not 1 <= body_min_rate <= MAX_BODY_MIN_RATE:
        raise common.CommandFailed(common.EXIT_USAGE, f"--body-min-rate: must be a whole "
                                   f"number of bytes a second from 1 to {MAX_BODY_MIN_RATE}: "
                                   f"{body_min_rate}")
    if not args.grace >= 0.0:
        raise common.CommandFailed(common.EXIT_USAGE, f"--grace: must be a number of seconds "
                                   f">= 0: {args.grace}")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None

    def say(message: str) -> None:
        print(f"edge serve: {message}", file=sys.stderr, flush=True)

    configs = _configs(args.pipelines)
    queues = queue_policies(args, [config.name for config in configs])
    limit = raise_open_file_limit()  # before any worker starts: they inherit it
    sock = _bind(args.host, args.port)
    executors: list[ThreadPoolExecutor] = []
    upload_dir = private_upload_dir()
    pipelines: list[Pipeline] = []
    plugin_errors: list[dict[str, Any]] = []
    stopped = False
    drain = Drain(args.grace)
    cap: ConnectionCap | None = None
    logs = None
    try:
        _unwind_on_sigterm()
        logs = common.worker_logs(args.verbose, common.say)  # before any opens
        ledger, pipelines = _open(configs, say, plugin_errors)
        served = {}
        threads = 0
        for pipeline in pipelines:
            workers = 2 * pipeline.config.admission + 2
            threads += workers
            executor = ThreadPoolExecutor(max_workers=workers,
                                          thread_name_prefix=f"edge-serve-{pipeline.config.name}")
            executors.append(executor)
            served[pipeline.config.name] = ServedPipeline(pipeline, executor, upload_dir,
                                                          drain, queues[pipeline.config.name])
        state = ServerState(served, ledger, max_body_bytes=args.max_body_bytes, drain=drain,
                            plugin_errors=plugin_errors, body_timeout_s=body_timeout,
                            body_min_rate=body_min_rate)
        app = build_app(state, api_key=api_key)
        # uvicorn's own timeout is a backstop only: the drain ends every open request at
        # the end of the grace period, so uvicorn finds nothing to cut. The protocol is
        # named (auto picks it too): the sweep of slow heads reads its state. The loop is
        # asyncio's own, also where uvloop is installed: its accept() calls are the
        # listening socket's, which keeps to the connection cap (uvloop accepts by itself).
        protocol = bounded_protocol(on_refused=state.metrics.count_head_too_large)
        config = uvicorn.Config(app, http=protocol, loop="asyncio", log_level="warning",
                                access_log=False, lifespan="off",
                                timeout_graceful_shutdown=args.grace + UVICORN_MARGIN_S)
        heads = SlowHeads(header_timeout, on_close=state.metrics.count_header_timeout)
        cap = ConnectionCap(_max_connections(args.max_connections, limit, threads), heads,
                            state.bodies)
        sock.cap = cap
        state.metrics.watch_connections(cap)
        server = _Server(config, drain, heads)
        server.stop_on_signals()
        # What start-up made (modules, plugins, the opened pipelines) lives as long as the
        # server: kept out of the cyclic collector (its garbage collected first), whose
        # full passes would otherwise walk all of it again and again while requests wait.
        gc.collect()
        gc.freeze()
        say(_files_line(limit, cap.limit))
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        say(f"listening on http://{shown}:{port} ({', '.join(served)})"
            + _not_loaded(plugin_errors))
        server.run(sockets=[sock])
        say(f"stopping ({server.stop_signal or 'server ended'}): closing the pipelines")
    except (Stopped, KeyboardInterrupt):
        say("stopped by a signal before serving")
        stopped = True
    except common.CommandFailed as failure:  # a pipeline that failed to open: its log
        failure.body["worker_logs"] = str(logs) if logs is not None else None
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # closing is bounded: let it finish
            signal.signal(sig, signal.SIG_IGN)
        sock.close()
        closing = time.monotonic()
        cancel = _cancel_all(pipelines)
        for executor in executors:
            executor.shutdown(wait=True, cancel_futures=True)
        closed = _close_all(pipelines)
        closing_s = round(time.monotonic() - closing, 3)
        shutil.rmtree(upload_dir, ignore_errors=True)
    snapshot = pipelines[0].ledger.snapshot() if pipelines else {"reservations": []}
    clean = not snapshot["reservations"] and all(
        stage.get("release") in ("released", "none")
        and (stage.get("retire") is None or stage["retire"].get("verified") is True)
        for summary in closed.values() for stage in summary.values())
    retire_s = _retire_times(closed)
    connections = None if cap is None else {"max": cap.limit, "refused": cap.refused,
                                            "evicted": cap.evicted}
    report = {"ok": clean and not stopped, "stopped_before_serving": stopped,
              "closed": closed, "retire_s": retire_s, "closing_s": closing_s,
              "ledger_after_close": snapshot, "plugin_errors": plugin_errors,
              "open_files": limit.to_json(), "connections": connections,
              "worker_logs": str(logs) if logs is not None else None, **cancel}
    if args.json:
        common.print_json(report)
    else:
        shown = ", ".join(f"{name}/{stage} {seconds:.2f} s" for name, stages in retire_s.items()
                          for stage, seconds in stages.items() if seconds is not None)
        say(f"closed in {closing_s:.2f} s (retire: {shown or 'no workers'}): every worker "
            f"retired and verified, reservations released: {clean}")
    return common.EXIT_OK if clean and not stopped else common.EXIT_FAILED


FORCE_AFTER_S = 0.5
"""After a second SIGINT, how long the open requests' 503 answers have to be written."""


class _Server:
    """uvicorn's server, stopped by SIGINT/SIGTERM through handlers installed before it runs.

    uvicorn installs its own handlers only once its loop has started, and re-raises the
    signal after shutting down; here a signal that comes right after ``listening on`` is
    printed must stop the server too, and the pipelines still have to be closed after it,
    so the handlers are installed by :meth:`stop_on_signals` and only recorded. The grace
    period is timed from the signal: when it ends, ``drain`` ends every request still open.
    ``heads`` sweeps the server's connections for request heads that do not arrive in
    time from start-up until shutdown begins.
    """

    def __init__(self, config: Any, drain: Drain, heads: SlowHeads) -> None:
        import uvicorn

        outer = self

        class Server(uvicorn.Server):
            @contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the handlers of stop_on_signals stay in place

            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                heads.start(self.server_state.connections)
                outer.started(asyncio.get_running_loop())

            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                heads.stop()
                await super().shutdown(sockets=sockets)

        self.stop_signal: str | None = None
        self.drain = drain
        self._signalled_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grace: asyncio.Task[None] | None = None
        self._server = Server(config)

    def started(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server's loop runs: a signal that came before starts the grace period now."""
        self._loop = loop
        if self._signalled_at is not None:
            self._end_grace_later()

    def _end_grace_later(self) -> None:
        if self._grace is None and self._loop is not None and self._signalled_at is not None:
            self._grace = self._loop.create_task(self._end_grace(self._signalled_at))

    async def _end_grace(self, signalled_at: float) -> None:
        await asyncio.sleep(max(0.0, signalled_at + self.drain.grace_s - time.monotonic()))
        self.drain.end()

    def _stop_now(self) -> None:
        """A second SIGINT: the grace period ends now, then uvicorn stops without waiting.

        Every request still open is answered first, as at the grace period's end (503
        ``server_shutting_down``, in JSON or as a stream's error event); uvicorn is told to
        stop waiting for connections :data:`FORCE_AFTER_S` later, once those answers are
        written, instead of cancelling their tasks into 500s and logged tracebacks.
        """
        self.drain.end()
        assert self._loop is not None
        self._loop.call_later(FORCE_AFTER_S, self._force)

    def _force(self) -> None:
        self._server.force_exit = True

    def stop_on_signals(self) -> None:
        """From now on SIGINT and SIGTERM stop the server (a second SIGINT: at once)."""
        server = self._server

        def handle(signum: int, frame: object) -> None:
            self.stop_signal = signal.Signals(signum).name
            if server.should_exit and signum == signal.SIGINT:  # a second SIGINT: now
                if self._loop is None:
                    server.force_exit = True
                else:  # on the loop's own thread, between its steps
                    self._loop.call_soon_threadsafe(self._stop_now)
            server.should_exit = True
            if self._signalled_at is None:
                self._signalled_at = time.monotonic()
                if self._loop is not None:  # on the loop's own thread, between its steps
                    self._loop.call_soon_threadsafe(self._end_grace_later)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle)

    def run(self, sockets: list[socket.socket]) -> None:
        """Serve on ``sockets`` until a signal."""
        self._server.run(sockets=sockets)
