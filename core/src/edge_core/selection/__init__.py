"""Placement by measurement: which candidate of each stage serves, judged on the whole chain.

The parts that need no running pipeline live here and are tested on their own:

- :mod:`~edge_core.selection.statistics`: quantiles with distribution-free bounds;
- :mod:`~edge_core.selection.racing`: a race between candidates (who is timed next, who
  stops, who wins, ties to the earlier-listed);
- :mod:`~edge_core.selection.combinations`: joint or greedy measurement of several
  stages' candidates, the fewest-backend placement, and when a split is kept;
- :mod:`~edge_core.selection.key` and :mod:`~edge_core.selection.store`: the key a
  decision is stored under and the store in the user's cache directory.

The runtime measures while a pipeline opens (docs/placement.md, "Placement by measurement").
"""

from __future__ import annotations

from edge_core.selection.combinations import (
    Figures,
    Schedule,
    SplitVerdict,
    backends_of,
    fewest_backends,
    greedy_entrants,
    joint_entrants,
    judge_split,
    plan_schedule,
)
from edge_core.selection.key import KEY_PARTS, DecisionKey, decision_key
from edge_core.selection.racing import STOP_REASONS, Race, RaceResult, RaceSettings
from edge_core.selection.statistics import Summary, quantile_bounds, summarize
from edge_core.selection.store import (
    CACHE_ENV,
    DecisionCacheWarning,
    DecisionStore,
    Lookup,
    StoredDecision,
    check_decision,
    default_cache_dir,
)

__all__ = [
    "CACHE_ENV",
    "KEY_PARTS",
    "STOP_REASONS",
    "DecisionCacheWarning",
    "DecisionKey",
    "DecisionStore",
    "Figures",
    "Lookup",
    "Race",
    "RaceResult",
    "RaceSettings",
    "Schedule",
    "SplitVerdict",
    "StoredDecision",
    "Summary",
    "backends_of",
    "check_decision",
    "decision_key",
    "default_cache_dir",
    "fewest_backends",
    "greedy_entrants",
    "joint_entrants",
    "judge_split",
    "plan_schedule",
    "quantile_bounds",
    "summarize",
]
