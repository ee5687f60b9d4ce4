"""The ``qnn`` backend's stage options and how they become QNN provider options.

A stage's ``[backend.options]`` are structured strictly into :class:`QnnOptions` by the
plugin's ``edge_validate_stage`` hook (every ORT option, plus the QNN ones below).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from edge_core.errors import ConfigError
from edge_ort.options import OrtOptions

__all__ = [
    "BACKEND_TYPES",
    "CACHE_ENV",
    "MANAGED_PROVIDER_OPTIONS",
    "PERFORMANCE_MODES",
    "QnnOptions",
    "default_cache_dir",
    "provider_options",
]

#: QNN backends the EP can load (the simulator wheel ships HTP; GPU and CPU may fail).
BACKEND_TYPES = ("htp", "gpu", "cpu")
#: The QNN EP's ``htp_performance_mode`` values.
PERFORMANCE_MODES = (
    "default", "burst", "balanced", "high_performance", "high_power_saver",
    "low_balanced", "low_power_saver", "power_saver", "extreme_power_saver",
    "sustained_high_performance",
)
#: Provider options the typed fields set; naming them in ``provider_options`` is refused.
MANAGED_PROVIDER_OPTIONS = ("backend_type", "backend_path", "htp_performance_mode",
                            "soc_model", "enable_htp_fp16_precision")
#: Environment variable naming the EP-context cache directory (overridden by the option).
CACHE_ENV = "EDGE_QNN_CONTEXT_CACHE"


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(_: object, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in choices:
            raise ConfigError(attribute.name, f"must be one of {', '.join(choices)}", value)

    return check


def _check_soc(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise ConfigError(attribute.name, "must be a positive QNN SoC model number", value)


def default_cache_dir() -> Path:
    """``$EDGE_QNN_CONTEXT_CACHE``, else ``$XDG_CACHE_HOME/edge/qnn-context`` (or ~/.cache)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge" / "qnn-context"


@attrs.frozen
class QnnOptions(OrtOptions):
    """Options of a ``qnn`` stage (all ORT options, plus these).

    Attributes:
        backend_type: The QNN backend library: ``htp`` (the NPU; the HTP simulator on
            x86_64), ``gpu`` or ``cpu``.
        performance_mode: The HTP performance mode (``default``, ``burst`` ...).
        soc_model: The QNN SoC model number the graph is prepared for (e.g. 60 for
            Snapdragon 8 Gen 3); ``None`` lets the EP choose.
        fp16_precision: Run float32 graphs in fp16 on HTP; needs ``soc_model``.
        context_cache: Keep compiled graphs as EP-context models and reuse them.
        context_cache_dir: Where the EP-context cache lives (default: see
            :func:`default_cache_dir`).
        session_per_bucket: Here ``True`` by default: HTP runs static shapes only, so
            every static bucket of the shape set is compiled (and cached) on its own.
    """

    backend_type: str = attrs.field(default="htp", validator=_one_of(BACKEND_TYPES))
    performance_mode: str = attrs.field(default="default",
                                        validator=_one_of(PERFORMANCE_MODES))
    soc_model: int | None = attrs.field(default=None, validator=_check_soc)
    fp16_precision: bool = False
    context_cache: bool = True
    context_cache_dir: str | None = None
    session_per_bucket: bool = True

    def __attrs_post_init__(self) -> None:
        if self.fp16_precision and self.soc_model is None:
            raise ConfigError("fp16_precision", "needs soc_model to be set", True)
        for key in self.provider_options:
            if key in MANAGED_PROVIDER_OPTIONS:
                raise ConfigError(f"provider_options.{key}",
                                  "is set through its own typed option", key)

    def cache_dir(self) -> Path:
        """The EP-context cache directory this stage uses."""
        return Path(self.context_cache_dir) if self.context_cache_dir else default_cache_dir()


def provider_options(options: QnnOptions) -> dict[str, str]:
    """The QNN EP's provider options for ``options`` (all values strings)."""
    result = {str(k): str(v) for k, v in options.provider_options.items()}
    result["backend_type"] = options.backend_type
    if options.performance_mode != "default":
        result["htp_performance_mode"] = options.performance_mode
    if options.soc_model is not None:
        result["soc_model"] = str(options.soc_model)
    if options.fp16_precision:
        result["enable_htp_fp16_precision"] = "1"
    return result
