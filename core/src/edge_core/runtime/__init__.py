"""The runtime: admission, loading and gating of a pipeline, flow control, cancellation.

Public API for serving code: :class:`Pipeline` (``run``/``arun``/``stream``/``submit``,
``cancel``, ``health``, ``close``), the :class:`Submission` handle, the stage state
machine (:class:`StageState`, :class:`StageHealth`, :class:`RestartPolicy`) and the errors
a request can end with (:class:`DeadlineExceeded`, :class:`WorkerUnresponsive`,
:class:`RequestCancelled`, :class:`RequestFailed`, :class:`RequestTooLarge`, ...).
"""

from edge_core.errors import DeadlineExceeded
from edge_core.fanout import Call, Fanout
from edge_core.host.errors import WorkerUnresponsive
from edge_core.runtime.candidates import CandidatesRefused
from edge_core.runtime.chain import GatheredResult
from edge_core.runtime.errors import (
    DemandExceeded,
    DuplicateRequest,
    NumericsRefused,
    RequestCancelled,
    RequestFailed,
    TopologyRefused,
)
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.health import RestartMode, RestartPolicy, StageHealth, StageState
from edge_core.runtime.pipeline import Pipeline, PipelineResult
from edge_core.runtime.results import AckOutcome, OutputReleased, ResultKey, StageResult
from edge_core.runtime.stage_runtime import PendingCall, StageRuntime
from edge_core.runtime.submission import RequestTooLarge, Submission

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
    "StageResult",
    "StageRuntime",
    "StageState",
    "Submission",
    "TopologyRefused",
    "WorkerUnresponsive",
]
