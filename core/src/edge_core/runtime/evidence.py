"""The evidence label of a stage in the execution plan, decided by core, not by the plugin.

``complete-model`` says that the whole model's outputs on the example bucket were checked
against a reference the backend could not have chosen: the bundle's expected outputs,
named by ``metadata.validation.expected_outputs``, a member of the manifest's hashed
``files`` whose bytes core hashes again here. Anything else — a numerical check against a
run the backend made itself (``cpu-run`` in the backend's own worker), a label the plugin
made up, a failed or missing check, a stage without a bundle — is ``backend-execution``:
the stage ran on its backend, and that is all the plan claims.

Or a run on an independent runtime in a worker that core starts: a stage that names
``reference_backend`` has the bundle's example inputs run on that backend too, and the
outputs compared within the stage's bound (:mod:`edge_core.runtime.independent`; core
itself never imports a runtime). ``complete-model`` then only when that comparison was
made and passed; the basis names the reference (``independent-run:<backend>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_core.artifacts.hashing import sha256_path
from edge_core.artifacts.references import expected_outputs_path
from edge_core.artifacts.verify import read_manifest
from edge_core.errors import EdgeError

__all__ = ["BACKEND_EXECUTION", "COMPLETE_MODEL", "EXPECTED_OUTPUTS", "evidence_label"]

COMPLETE_MODEL = "complete-model"
BACKEND_EXECUTION = "backend-execution"
#: The numerics ``reference`` that names the bundle's expected outputs.
EXPECTED_OUTPUTS = "expected-outputs"


def evidence_label(numerics: Mapping[str, Any] | None, manifest_dir: Path | None,
                   reference: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """The label and the reason for it, from the warm-up's numerics and the bundle.

    ``reference`` is the record of an independent reference run
    (:func:`edge_core.runtime.independent.reference_run`), when the stage asked for one:
    the bundle's hashed expected outputs are looked at first, then that run.
    """
    label, basis = _from_bundle(numerics, manifest_dir)
    if label == COMPLETE_MODEL or reference is None:
        return label, basis
    name = reference.get("reference")
    if reference.get("passed") is True and str(name).startswith("independent-run:"):
        return COMPLETE_MODEL, (f"compared with {name}, a run of the bundle's example inputs on "
                                "an independent runtime in a worker core started, within "
                                f"the bound {reference.get('bound')}")
    return BACKEND_EXECUTION, (f"{basis}; {name}: not compared or no match: "
                               f"{reference.get('reason')}")


def _from_bundle(numerics: Mapping[str, Any] | None,
                 manifest_dir: Path | None) -> tuple[str, str]:
    if not numerics or numerics.get("passed") is not True:
        return BACKEND_EXECUTION, "no passing numerical check of the example bucket"
    reference = numerics.get("reference")
    if reference != EXPECTED_OUTPUTS:
        return BACKEND_EXECUTION, (f"the reference {reference!r} is not the bundle's hashed "
                                   "expected outputs")
    if manifest_dir is None:
        return BACKEND_EXECUTION, "expected outputs claimed, but the stage has no bundle"
    try:
        manifest, _raw, _fingerprint = read_manifest(manifest_dir)
        member = expected_outputs_path(manifest)
        if member is None:
            return BACKEND_EXECUTION, ("expected outputs claimed, but the manifest names "
                                       "none (metadata.validation.expected_outputs)")
        digest = sha256_path(manifest_dir / member)
    except (EdgeError, OSError, ValueError) as exc:
        return BACKEND_EXECUTION, f"the bundle's expected outputs cannot be checked: {exc}"
    if digest != manifest.files[member]:
        return BACKEND_EXECUTION, f"{member}: sha256 differs from the manifest"
    return COMPLETE_MODEL, f"compared with {member}, a hashed member of the verified bundle"
