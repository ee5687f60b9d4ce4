"""The echo worker: ``y = x * scale`` after a delay, with injectable failures.

In streaming mode (``stream_chunks`` > 0) a request first sends that many TOKEN events, at
``chunk_rate_hz`` (each ``{"index", "token_ids", "text"}``, plus ``duration_s`` with
``chunk_seconds``), then its DONE with the outputs, the token ids and ``num_tokens``,
``prompt_tokens`` (the inputs' element count), ``finish_reason`` and ``text``: the shape
of a generate or speech stage's stream, with no model behind it.

Imports only ``edge_contracts`` and numpy, like every worker module.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.error_copies import whole_reduction
from edge_contracts.worker import BaseHandler, Call

__all__ = ["EchoHandler", "create"]


class InjectedFailure(RuntimeError):
    """A failure the stage's options asked for."""


class ParamRefused(ValueError):
    """A request refused as its own fault, naming the parameter ``refuse`` it sent.

    Declares the request fault ``invalid_value`` (:mod:`edge_contracts.request_faults`),
    so the worker's error event carries it as a backend's refusal of a parameter does.
    """

    request_fault = "invalid_value"

    def __init__(self, field: str, value: object) -> None:
        self.field = field
        super().__init__(f"params.{field}: refused as the request asked: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


class RequestRefused(ValueError):
    """A request refused as its own fault as a whole, naming no field (``refuse_unnamed``).

    Declares the request fault ``invalid_value`` with no ``field``: a backend that refuses
    a request without being able to say which of its values is at fault.
    """

    request_fault = "invalid_value"

    def __init__(self, value: object) -> None:
        super().__init__(f"the request was refused as a whole, as it asked: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


class EchoHandler(BaseHandler):
    """Multiplies every input by ``scale``; cancellable in place when preemptible."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self._ballast: bytearray | None = None
        self._request_ballast: bytearray | None = None
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    def versions(self) -> Mapping[str, str]:
        """Numpy is the runtime here."""
        return {"numpy": np.__version__, "edge_echo": "0.1.0"}

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Keep the options; allocate (and touch) ``allocate_mb`` of memory if asked."""
        self.options = dict(config)
        if self.options.get("load_delay_s"):
            time.sleep(float(self.options["load_delay_s"]))
        if self.options.get("fail_at") == "load":
            raise InjectedFailure("load failed as configured")
        megabytes = int(self.options.get("allocate_mb", 0))
        if megabytes:
            self._ballast = bytearray(megabytes * 1024 * 1024)
            for offset in range(0, len(self._ballast), 4096):
                self._ballast[offset] = 1
        return {"loaded": True, "pid_note": "echo"}

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Report one node on the configured provider and the warm-up numerics."""
        if self.options.get("fail_at") == "warmup":
            raise InjectedFailure("warm-up failed as configured")
        shape = tuple(self.options.get("example_shape", [2, 2]))
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        y = self._compute({"x": x}, {})["x"]
        expected = x * float(self.options.get("scale", 1.0))
        if self.options.get("wrong_numerics"):
            expected = expected + 1.0
        error = float(np.max(np.abs(y - expected))) if y.size else 0.0
        provider = str(self.options.get("provider", "numpy"))
        return {
            "providers": {provider: {"nodes": 1, "op_types": {"Mul": 1},
                                     "node_names": ["echo_mul"]}},
            "available": ["numpy"],
            "numerics": {"reference": "expected-outputs", "max_abs_error": error,
                         "normalised_error": error, "bound": {"max_abs_error": 0.0},
                         "passed": error == 0.0},
        }

    def _compute(self, inputs: Mapping[str, np.ndarray],
                 params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``x * scale`` for every input, plus ``pad`` when the request asks for one."""
        scale = float(self.options.get("scale", 1.0))
        outputs = {name: (np.asarray(a) * scale).astype(np.asarray(a).dtype)
                   for name, a in inputs.items()}
        pad = int(params.get("pad_output_bytes", 0))
        if pad:
            outputs["pad"] = np.zeros(pad, np.uint8)
        return outputs

    def _stream(self, call: Call) -> dict[str, Any]:
        """How this request streams: chunk count, rate, tokens per chunk, a stall."""
        params, options = call.params, self.options
        return {
            "chunks": int(params.get("stream_chunks", options.get("stream_chunks", 0))),
            "rate": float(params.get("chunk_rate_hz", options.get("chunk_rate_hz", 0.0))),
            "tokens": max(1, int(params.get("tokens_per_chunk",
                                            options.get("tokens_per_chunk", 1)))),
            "seconds": options.get("chunk_seconds"),
            "stall_after": params.get("stall_after"),
            "stall_s": float(params.get("stall_s", 0.0)),
        }

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Compute after ``delay_s``: inline (blocking) or on a thread when preemptible.

        A request's params may ask for a failure of its own: ``fail_call`` (its ERROR
        event), ``crash`` (the worker exits at once: the controller sees it gone), or
        ``allocate_mb`` (memory allocated and touched while serving it, kept until the
        next request); ``pad_output_bytes`` adds an output ``pad`` of that many zero bytes;
        ``refuse`` is refused as the request's own fault (:class:`ParamRefused`), and
        ``refuse_unnamed`` as the request's own fault naming no field
        (:class:`RequestRefused`).
        """
        if self.options.get("fail_at") == "call":
            raise InjectedFailure("call failed as configured")
        if "refuse" in call.params:
            raise ParamRefused("refuse", call.params["refuse"])
        if "refuse_unnamed" in call.params:
            raise RequestRefused(call.params["refuse_unnamed"])
        if call.params.get("crash"):
            os._exit(3)
        if call.params.get("fail_call"):
            raise InjectedFailure("call failed as the request asked")
        megabytes = int(call.params.get("allocate_mb", 0))
        self._request_ballast = bytearray(megabytes * 1024 * 1024) if megabytes else None
        if self._request_ballast is not None:
            for offset in range(0, len(self._request_ballast), 4096):
                self._request_ballast[offset] = 1
        # A request may ask for its own delay (``params.delay_s``): a slow request.
        delay = float(call.params.get("delay_s", self.options.get("delay_s", 0.0)))
        stream = self._stream(call)
        if not self.options.get("preemptible"):
            if delay:
                time.sleep(delay)
            if not stream["chunks"]:
                return self._compute(call.inputs, call.params)
            streamed = self._streamed(call, call.inputs, stream)
            if streamed is not None:
                call.done(*streamed)
            return None
        inputs = {name: np.array(a, copy=True) for name, a in call.inputs.items()}
        threading.Thread(target=self._later, args=(call, inputs, delay, stream),
                         daemon=True).start()
        return None

    def _take_cancel(self, request_id: str) -> bool:
        with self._lock:
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                return True
        return False

    def _wait(self, call: Call, until: float) -> bool:
        """Sleep until ``until`` (monotonic); False when the request was cancelled."""
        while True:
            if self.options.get("preemptible") and self._take_cancel(call.request_id):
                return False
            left = until - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.005))

    def _streamed(self, call: Call, inputs: Mapping[str, np.ndarray], stream: Mapping[str, Any],
                  ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Send the TOKEN events; the DONE's outputs and data, or None if cancelled."""
        rate, per = stream["rate"], stream["tokens"]
        start = time.monotonic()
        stalled = 0.0
        texts = []
        for index in range(stream["chunks"]):
            if stream["stall_after"] is not None and index == int(stream["stall_after"]):
                stalled = stream["stall_s"]
            if not self._wait(call, start + stalled + (index / rate if rate > 0 else 0.0)):
                return None
            data: dict[str, Any] = {"index": index,
                                    "token_ids": [index * per + j for j in range(per)],
                                    "text": f" t{index}"}
            if stream["seconds"] is not None:
                data["duration_s"] = float(stream["seconds"])
            texts.append(data["text"])
            if not call.token(data):
                return None  # cancelled: the loop answered CANCELLED already
        outputs = self._compute(inputs, call.params)
        count = stream["chunks"] * per
        outputs["token_ids"] = np.arange(count, dtype=np.int64)
        return outputs, {"num_tokens": count, "finish_reason": "length", "text": "".join(texts),
                         "prompt_tokens": int(sum(np.asarray(a).size for a in inputs.values()))}

    def _later(self, call: Call, inputs: Mapping[str, np.ndarray], delay: float,
               stream: Mapping[str, Any]) -> None:
        if not self._wait(call, time.monotonic() + delay):
            return
        if not stream["chunks"]:
            call.done(self._compute(inputs, call.params))
        else:
            streamed = self._streamed(call, inputs, stream)
            if streamed is None:
                return
            call.done(*streamed)
        with self._lock:
            self._cancelled.discard(call.request_id)

    def cancel(self, request_id: str) -> None:
        """Stop a running request in place."""
        with self._lock:
            self._cancelled.add(request_id)


def create() -> EchoHandler:
    """The route entry's factory."""
    return EchoHandler()
