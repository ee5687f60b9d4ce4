"""Test-only worker entry: edge_ort's worker with an execution-provider failure INJECTED.

Route entry ``ep_failure_injected:create`` (this folder on the route's ``python_path``).
The handler is :class:`edge_ort.worker.OrtHandler` itself; ``EDGE_TEST_INJECT`` picks the
fault, injected where ONNX Runtime's Python wrapper meets the compiled session:

- ``run-epfail-once``: after the warm-up, the session's compiled session (``_sess``) is
  replaced by :class:`FailsOnce`, whose ``run`` raises ONNX Runtime's own ``EPFail`` on
  the first call and hands every other call (and attribute) to the compiled session.
- ``create-fails``: creating a session on any providers but the CPU alone raises
  ``RuntimeError`` once (what the wrapper's creation fallback catches), before anything is
  compiled.

After each call the handler writes ``EDGE_TEST_REPORT`` (JSON): the session's providers,
whether the compiled session is still the injected one, and the runs it handed on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from edge_contracts.worker import Call
from edge_ort.worker import OrtHandler

__all__ = ["FailsOnce", "InjectedHandler", "create"]

CPU = "CPUExecutionProvider"


class FailsOnce:
    """A compiled session whose first ``run`` raises ``EPFail`` (injected); then delegates."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False
        self.delegated = 0

    def run(self, *args: Any) -> Any:
        """Raise the injected ``EPFail`` once, then run on the real compiled session."""
        if not self.failed:
            from onnxruntime.capi.onnxruntime_pybind11_state import EPFail

            self.failed = True
            raise EPFail("injected EP failure (test): the provider failed this run")
        self.delegated += 1
        return self.inner.run(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _fail_creation_once() -> None:
    """Make the next session creation on a non-CPU provider list raise ``RuntimeError``."""
    import onnxruntime as ort

    original = ort.InferenceSession._create_inference_session
    state = {"failed": False}

    def create_session(self: Any, providers: Any, provider_options: Any,
                       disabled_optimizers: Any = None) -> Any:
        names = [p[0] if isinstance(p, tuple) else p for p in providers or []]
        if not state["failed"] and names != [CPU]:
            state["failed"] = True
            # as the wrapper's own creation does before the compiled session fails
            self._fallback_providers = [CPU]
            raise RuntimeError("injected session creation failure (test)")
        return original(self, providers, provider_options, disabled_optimizers)

    ort.InferenceSession._create_inference_session = create_session


class InjectedHandler(OrtHandler):
    """:class:`OrtHandler` with the fault ``EDGE_TEST_INJECT`` names."""

    def __init__(self) -> None:
        super().__init__()
        self._inject = os.environ.get("EDGE_TEST_INJECT", "")
        self._failing: FailsOnce | None = None
        if self._inject == "create-fails":
            _fail_creation_once()

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Warm up as the real handler does, then inject the run fault when asked."""
        report = super().warmup(config)
        if self._inject == "run-epfail-once":
            session = self._session
            self._failing = FailsOnce(session._sess)
            session._sess = self._failing
        return report

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Run the call as the real handler does; write the report either way."""
        try:
            return super().submit(call)
        finally:
            self._write_report()

    def _write_report(self) -> None:
        session = self._session
        failing = self._failing
        report = {
            "providers": list(session.get_providers()),
            "injected_still_in_place": failing is not None and session._sess is failing,
            "injected_failed": bool(failing and failing.failed),
            "delegated_runs": failing.delegated if failing else 0,
        }
        with open(os.environ["EDGE_TEST_REPORT"], "w", encoding="utf-8") as handle:
            json.dump(report, handle)


def create() -> InjectedHandler:
    """The route entry's factory."""
    return InjectedHandler()
