"""One opened pipeline as the server holds it: its ends, its states, its blocking work.

A request's blocking part — ``prepare`` on an uploaded file, :meth:`Pipeline.run`,
``finish`` and the acknowledgement — runs as one function on the server's thread pool,
so the result's worker memory is given back in the same thread that read it.
:meth:`ServedPipeline.within` awaits it; the request's deadline is the runtime's to
enforce (it cancels the request, or retires a non-preemptible stage, and raises
``DeadlineExceeded``: 504).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from edge_core.config.transforms import resolve_input_transform
from edge_core.runtime.pipeline import Pipeline
from edge_serve.outcomes import HttpRefusal, deadline_passed, stage_unready
from edge_serve.tensors import encode_tensors

__all__ = ["Answer", "ServedPipeline"]

T = TypeVar("T")

READY = "ready"

BACKSTOP_S = 2.0
"""How long after a request's deadline the server answers 504 without the runtime."""


class Answer:
    """What one request produced: the JSON answer and each stage's latency in seconds."""

    __slots__ = ("body", "latencies")

    def __init__(self, body: dict[str, Any], latencies: Mapping[str, float]) -> None:
        self.body = body
        self.latencies = dict(latencies)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Take a dropped request's outcome so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


class ServedPipeline:
    """An opened pipeline behind the HTTP routes.

    Args:
        pipeline: The admitted, loaded, gated pipeline (the server closes it).
        executor: Where the blocking part of each request runs.
        upload_dir: A private directory (0700) for uploaded files on their way to
            ``prepare``.
    """

    def __init__(self, pipeline: Pipeline, executor: Executor, upload_dir: Path) -> None:
        config = pipeline.config
        self.pipeline = pipeline
        self.name = config.name
        self.executor = executor
        self.upload_dir = upload_dir
        self.prepare: Callable[..., Any] | None = None
        self.finish: Callable[..., Any] | None = None
        if config.prepare is not None:
            self.prepare = resolve_input_transform(config.prepare, "prepare")
        if config.finish is not None:
            self.finish = resolve_input_transform(config.finish, "finish")
        last = pipeline.stages[-1]
        self.generates = "generate" in {k.value for k in last.binding.backend.kinds}

    # -- states ---------------------------------------------------------------------------

    def stage_states(self) -> dict[str, str]:
        """Stage id → state (``ready``, ``needs-restart``, ``failed``, ``restarting``...)."""
        return {runtime.stage_id: runtime.state.value for runtime in self.pipeline.stages}

    def restarts(self) -> dict[str, int]:
        """Stage id → worker restarts so far (each restart is a new generation)."""
        return {runtime.stage_id: runtime.generation - 1 for runtime in self.pipeline.stages}

    def require_ready(self) -> None:
        """Refuse (503) while any stage is not ready."""
        for stage, state in self.stage_states().items():
            if state != READY:
                raise stage_unready(self.name, stage, state)

    def describe(self) -> dict[str, Any]:
        """The pipeline as ``GET /v1/pipelines`` lists it."""
        plan = self.pipeline.execution_plan()
        states = self.stage_states()
        return {
            "name": self.name,
            "state": "ready" if all(s == READY for s in states.values()) else "degraded",
            "admission": self.pipeline.config.admission,
            "accepts": (["tensors", "file"] if self.prepare is not None else ["tensors"])
            + (["completions", "chat.completions"] if self.generates else []),
            "stages": [{"id": s["id"], "backend": s["backend"], "kind": s["kind"],
                        "state": states.get(s["id"]), "generation": s["generation"]}
                       for s in plan["stages"]],
            "plan": plan,
        }

    # -- blocking work (runs on the executor) -------------------------------------------------

    def answer(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
               deadline_s: float | None) -> Answer:
        """Run one request and build its answer: ``finish``'s, else the outputs as tensors."""
        with self.pipeline.run(inputs, params=params, deadline_s=deadline_s) as result:
            if self.finish is not None:
                body = {"answer": self.finish(result.outputs, inputs,
                                              self.pipeline.bundle_directories())}
            else:
                body = {"outputs": encode_tensors(result.outputs)}
            latencies = result.latencies
        body["latency_ms"] = {k: round(v * 1e3, 3) for k, v in latencies.items()}
        return Answer(body, latencies)

    def answer_file(self, data: bytes, suffix: str, params: Mapping[str, Any] | None,
                    deadline_s: float | None) -> Answer:
        """``prepare`` the uploaded bytes (from a private file), then :meth:`answer`."""
        if self.prepare is None:
            raise HttpRefusal(400, "file", f"pipelines[{self.name}] names no 'prepare' "
                              "function to read a file with: send tensors as JSON")
        path = self.upload_dir / f"{secrets.token_hex(8)}{suffix}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            try:
                inputs = self.prepare(str(path))
            except Exception as exc:
                shown = str(exc).replace(str(path), "<upload>")  # no server paths
                raise HttpRefusal(400, "file", "the pipeline's prepare could not read it",
                                  f"{type(exc).__name__}: {shown}",
                                  kind=type(exc).__name__) from None
        finally:
            path.unlink(missing_ok=True)
        return self.answer(dict(inputs), params, deadline_s)

    # -- awaiting ----------------------------------------------------------------------------

    async def within(self, work: Callable[[], T], deadline_s: float | None) -> T:
        """Run ``work`` on the executor and await it.

        The runtime bounds the whole request by ``deadline_s`` itself (``Pipeline.run``
        raises ``DeadlineExceeded`` after cancelling the request, or retiring a
        non-preemptible stage), which answers 504 with the stage's state already settled.
        This timer is only a backstop, :data:`BACKSTOP_S` later, for work that does not
        return (a transform that hangs): it answers 504 and drops the answer.
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, work)
        if deadline_s is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline_s + BACKSTOP_S)
        except TimeoutError:
            future.add_done_callback(_retrieve)
            raise deadline_passed(self.name, deadline_s) from None


def private_upload_dir() -> Path:
    """A fresh directory only this user can read, for uploads on their way to ``prepare``."""
    return Path(tempfile.mkdtemp(prefix="edge-serve-"))
