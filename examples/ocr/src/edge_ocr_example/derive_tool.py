"""Whether this environment has ``edge derive``: edge-qnn with its ``derive`` extra.

``pipeline-auto.toml`` needs ``classify-qnn/``, which ``edge derive qnn-static`` makes;
the command comes with the edge-qnn plugin and runs with its ``derive`` extra (onnx,
Pillow, ml_dtypes, through edge-ort's own ``derive`` extra). :func:`derive_missing` reads
the installed distributions' metadata (``importlib.metadata``; nothing is imported) and
names what is missing, so that ``python -m edge_ocr_example.page_bundle`` tells a user who
has it all to run the command, and one who has not what to install.

Only presence is read, not versions; a requirement's extras are followed (``edge-ort[derive]``
needs edge-ort and the requirements of its ``derive`` extra). An environment marker other
than ``extra == "NAME"`` is not evaluated: such a requirement counts as needed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.metadata import Distribution, distributions
from typing import Final

__all__ = ["DERIVE_DISTRIBUTION", "DERIVE_EXTRA", "derive_missing"]

DERIVE_DISTRIBUTION: Final = "edge-qnn"
"""The distribution whose plugin adds ``edge derive`` (``edge_register_commands``)."""
DERIVE_EXTRA: Final = "derive"
"""Its extra that ``edge derive`` runs with."""

_REQUIREMENT: Final = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER: Final = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


def _normal(name: str) -> str:
    """A distribution or extra name as PEP 503 / PEP 685 compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str, path: Sequence[str] | None) -> Distribution | None:
    """The distribution ``name`` found on ``path`` (``sys.path`` when None), else None."""
    wanted = _normal(name)
    for found in distributions(path=list(path)) if path is not None else distributions():
        if _normal(found.metadata["Name"] or "") == wanted:
            return found
    return None


def _extra_requirements(dist: Distribution, extra: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(name, extras)`` of each requirement ``dist`` adds with ``extra``."""
    needed = []
    for text in dist.requires or ():
        spec, _, marker = text.partition(";")
        only = _EXTRA_MARKER.match(marker)
        if only is None or _normal(only.group(1)) != _normal(extra):
            continue  # a base requirement, or another extra's
        parsed = _REQUIREMENT.match(spec)
        if parsed is None:
            continue
        extras = tuple(e.strip() for e in (parsed.group(2) or "").split(",") if e.strip())
        needed.append((parsed.group(1), extras))
    return needed


def _missing_with(dist: Distribution, extra: str, path: Sequence[str] | None,
                  seen: set[tuple[str, str]]) -> list[str]:
    """Names of the distributions ``extra`` of ``dist`` needs that are not installed."""
    missing: list[str] = []
    for name, extras in _extra_requirements(dist, extra):
        found = _installed(name, path)
        if found is None:
            missing.append(name)
            continue
        for inner in extras:
            key = (_normal(name), _normal(inner))
            if key not in seen:
                seen.add(key)
                missing += [m for m in _missing_with(found, inner, path, seen)
                            if m not in missing]
    return missing


def derive_missing(path: Sequence[str] | None = None) -> str | None:
    """What this environment lacks for ``edge derive``, as the step that installs it.

    ``None`` when edge-qnn and every distribution its ``derive`` extra needs are
    installed (found on ``path``; ``sys.path`` when None). Otherwise a sentence naming
    what is missing and ending in ``pip install 'edge-qnn[derive]'``.
    """
    qnn = _installed(DERIVE_DISTRIBUTION, path)
    install = f"pip install '{DERIVE_DISTRIBUTION}[{DERIVE_EXTRA}]'"
    if qnn is None:
        return f"edge derive comes with the {DERIVE_DISTRIBUTION} plugin: {install}"
    missing = _missing_with(qnn, DERIVE_EXTRA, path, set())
    if not missing:
        return None
    return (f"edge derive needs {DERIVE_DISTRIBUTION}'s {DERIVE_EXTRA} extra, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
            f"{install}")
