"""Which placement a VitisAI stage may ask for, judged before anything loads.

An A16W8 graph (16-bit activations, 8-bit weights) keeps some nodes on the CPU under
VitisAI. Such a stage is admitted only when its placement policy says so — a
``min_fraction_on_target`` below 1 and ``CPUExecutionProvider`` among the allowed providers
— so that it is refused at once instead of after a long NPU compile. The warm-up gate still
judges the split it actually observes.
"""

from __future__ import annotations

import re

from edge_contracts.errors import ContractError
from edge_contracts.manifest import MANIFEST_FILENAME, ArtifactManifest
from edge_core.stage import StageContext
from edge_ort.vendor import StageRefused

__all__ = ["CPU", "check_a16w8_policy", "declared_precision", "is_a16w8"]

CPU = "CPUExecutionProvider"
_A16W8 = re.compile(r"a16w8", re.IGNORECASE)


def is_a16w8(precision: str | None) -> bool:
    """True for a precision label naming A16W8 (``A16W8``, ``a16w8-qdq`` ...)."""
    return bool(precision) and _A16W8.search(precision or "") is not None


def declared_precision(stage: StageContext) -> str | None:
    """The bundle manifest's ``metadata.precision``; ``None`` when absent or unreadable.

    An unreadable manifest is refused by the bundle's full verification at load.
    """
    if stage.manifest_dir is None:
        return None
    try:
        text = (stage.manifest_dir / MANIFEST_FILENAME).read_bytes()
        return ArtifactManifest.from_json(text).metadata.precision
    except (OSError, ContractError):
        return None


def check_a16w8_policy(stage: StageContext) -> None:
    """Refuse an A16W8 stage whose placement policy does not allow a CPU share.

    Raises:
        StageRefused: at ``stages[<id>].placement``, with the policy's values.
    """
    precision = declared_precision(stage)
    if not is_a16w8(precision):
        return
    policy = stage.placement
    if policy.min_fraction_on_target < 1.0 and CPU in policy.allowed_providers:
        return
    raise StageRefused(
        f"stages[{stage.stage_id}].placement",
        f"the bundle's precision is {precision}: an A16W8 graph keeps some nodes on CPU "
        f"under VitisAI, so the stage must set min_fraction_on_target below 1 and list "
        f"{CPU} in allowed_providers",
        {"min_fraction_on_target": policy.min_fraction_on_target,
         "allowed_providers": list(policy.allowed_providers)},
    )
