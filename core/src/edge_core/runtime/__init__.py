"""The runtime: admission, loading and gating of a pipeline, flow control, cancellation."""

from edge_core.fanout import Call, Fanout
from edge_core.runtime.chain import GatheredResult
from edge_core.runtime.errors import (
    DemandExceeded,
    DuplicateRequest,
    NumericsRefused,
    RequestCancelled,
    RequestFailed,
    TopologyRefused,
)
from edge_core.runtime.pipeline import Pipeline, PipelineResult
from edge_core.runtime.results import AckOutcome, OutputReleased, ResultKey, StageResult
from edge_core.runtime.stage_runtime import PendingCall, StageRuntime, StageState

__all__ = [
    "AckOutcome",
    "Call",
    "DemandExceeded",
    "DuplicateRequest",
    "Fanout",
    "GatheredResult",
    "NumericsRefused",
    "OutputReleased",
    "PendingCall",
    "Pipeline",
    "PipelineResult",
    "RequestCancelled",
    "RequestFailed",
    "ResultKey",
    "StageResult",
    "StageRuntime",
    "StageState",
    "TopologyRefused",
]
