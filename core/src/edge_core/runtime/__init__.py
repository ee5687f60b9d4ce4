"""The runtime: admission, loading and gating of a pipeline, flow control, cancellation.

Public API for serving code: :class:`Pipeline` (``run``/``arun``/``stream``/``submit``,
``cancel``, ``health``, ``close``) and :func:`open_pipeline` (from a file), the
:class:`Submission` handle, the stage state machine (:class:`StageState`,
:class:`StageHealth`, :class:`RestartPolicy`) and the errors a request can end with
(:class:`DeadlineExceeded`, :class:`WorkerUnresponsive`, :class:`RequestCancelled`,
:class:`RequestFailed`, :class:`RequestTooLarge`, ...). Opening stages one by one:
:class:`StageOpener` and its :class:`StageSlot`.

Every name is imported on first use, so that ``import edge_core.runtime.errors`` (or any
one module of the runtime) loads only what that module needs. docs/architecture.md draws
the modules' layers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_core.errors import DeadlineExceeded
    from edge_core.fanout import Call, Fanout
    from edge_core.host.errors import WorkerUnresponsive
    from edge_core.runtime.admission import RequestTooLarge
    from edge_core.runtime.candidate_entries import CandidatesRefused
    from edge_core.runtime.chain import GatheredResult
    from edge_core.runtime.errors import (
        DemandExceeded,
        DuplicateRequest,
        NumericsRefused,
        RequestCancelled,
        RequestFailed,
        TopologyRefused,
        TransformFailed,
        TransformOutputRefused,
        TransformReturnInvalid,
    )
    from edge_core.runtime.fence import FenceOutcome
    from edge_core.runtime.health import StageHealth, StageState
    from edge_core.runtime.opener import StageOpener
    from edge_core.runtime.pending import PendingCall
    from edge_core.runtime.pipeline import Pipeline
    from edge_core.runtime.pipeline_files import (
        default_ledger,
        load_config,
        open_pipeline,
        shared_ledger,
    )
    from edge_core.runtime.pipeline_result import PipelineResult
    from edge_core.runtime.restarts import RestartMode, RestartPolicy
    from edge_core.runtime.results import AckOutcome, OutputReleased, ResultKey, StageResult
    from edge_core.runtime.stage_runtime import StageRuntime
    from edge_core.runtime.stage_slot import StageSlot
    from edge_core.runtime.submission import Submission

_WHERE = {
    "AckOutcome": "edge_core.runtime.results",
    "Call": "edge_core.fanout",
    "CandidatesRefused": "edge_core.runtime.candidate_entries",
    "DeadlineExceeded": "edge_core.errors",
    "DemandExceeded": "edge_core.runtime.errors",
    "DuplicateRequest": "edge_core.runtime.errors",
    "Fanout": "edge_core.fanout",
    "FenceOutcome": "edge_core.runtime.fence",
    "GatheredResult": "edge_core.runtime.chain",
    "NumericsRefused": "edge_core.runtime.errors",
    "OutputReleased": "edge_core.runtime.results",
    "PendingCall": "edge_core.runtime.pending",
    "Pipeline": "edge_core.runtime.pipeline",
    "PipelineResult": "edge_core.runtime.pipeline_result",
    "RequestCancelled": "edge_core.runtime.errors",
    "RequestFailed": "edge_core.runtime.errors",
    "RequestTooLarge": "edge_core.runtime.admission",
    "RestartMode": "edge_core.runtime.restarts",
    "RestartPolicy": "edge_core.runtime.restarts",
    "ResultKey": "edge_core.runtime.results",
    "StageHealth": "edge_core.runtime.health",
    "StageOpener": "edge_core.runtime.opener",
    "StageResult": "edge_core.runtime.results",
    "StageRuntime": "edge_core.runtime.stage_runtime",
    "StageSlot": "edge_core.runtime.stage_slot",
    "StageState": "edge_core.runtime.health",
    "Submission": "edge_core.runtime.submission",
    "TopologyRefused": "edge_core.runtime.errors",
    "TransformFailed": "edge_core.runtime.errors",
    "TransformOutputRefused": "edge_core.runtime.errors",
    "TransformReturnInvalid": "edge_core.runtime.errors",
    "WorkerUnresponsive": "edge_core.host.errors",
    "default_ledger": "edge_core.runtime.pipeline_files",
    "load_config": "edge_core.runtime.pipeline_files",
    "open_pipeline": "edge_core.runtime.pipeline_files",
    "shared_ledger": "edge_core.runtime.pipeline_files",
}

__all__ = [
    "AckOutcome",
    "Call",
    "CandidatesRefused",
    "DeadlineExceeded",
    "DemandExceeded",
    "DuplicateRequest",
    "Fanout",
    "FenceOutcome",
    "GatheredResult",
    "NumericsRefused",
    "OutputReleased",
    "PendingCall",
    "Pipeline",
    "PipelineResult",
    "RequestCancelled",
    "RequestFailed",
    "RequestTooLarge",
    "RestartMode",
    "RestartPolicy",
    "ResultKey",
    "StageHealth",
    "StageOpener",
    "StageResult",
    "StageRuntime",
    "StageSlot",
    "StageState",
    "Submission",
    "TopologyRefused",
    "TransformFailed",
    "TransformOutputRefused",
    "TransformReturnInvalid",
    "WorkerUnresponsive",
    "default_ledger",
    "load_config",
    "open_pipeline",
    "shared_ledger",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'edge_core.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
