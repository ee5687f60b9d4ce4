"""The validated ``[backend.options]`` of an ``ort-directml`` stage, and adapter selection.

Kept apart from the hooks so that importing the plugin stays cheap. Every check names the
field, the reason and the value (``adapter_luid: must be decimal or 0x-hex digits: 'x'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from edge_contracts.devices import Integration
from edge_core.errors import ConfigError
from edge_ort.options import OrtOptions, base_load_config
from edge_ort.vendor import StageRefused
from edge_ort_directml.adapters import DmlAdapter, LuidInvalid, parse_luid

__all__ = ["PROVIDER", "DmlOptions", "dml_load_config", "select_adapter"]

#: The provider as ONNX Runtime lists it (``get_available_providers()``).
PROVIDER = "DmlExecutionProvider"
#: Provider options the typed fields own; ``provider_options`` may not set them.
_OWNED = ("device_id",)


def _index(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(attribute.name, "must be an adapter index >= 0", value)


def _luid(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    try:
        parse_luid(value, attribute.name)
    except LuidInvalid as exc:
        raise ConfigError(attribute.name, exc.reason, value) from None


def _integration(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in ("auto", "integrated", "discrete"):
        raise ConfigError(attribute.name, "must be auto, integrated or discrete", value)


@attrs.frozen
class DmlOptions(OrtOptions):
    """An ``ort-directml`` stage's options: the ORT ones plus the adapter.

    Attributes:
        adapter_index: The DXGI adapter number (DirectML's ``device_id``).
        adapter_luid: The adapter's LUID, decimal as ``get_ep_devices()`` reports it or
            ``0x`` hexadecimal. At most one of the two; with neither, adapter 0 (the one
            DirectML itself defaults to).
        integration: ``auto`` takes what ORT reports; ``integrated`` or ``discrete`` states
            it for an adapter whose integration ORT did not report (a contradiction with
            a reported value is refused).
    """

    adapter_index: int | None = attrs.field(default=None, validator=_index)
    adapter_luid: str | None = attrs.field(default=None, validator=_luid)
    integration: str = attrs.field(default="auto", validator=_integration)

    def __attrs_post_init__(self) -> None:
        if self.adapter_index is not None and self.adapter_luid is not None:
            raise ConfigError("adapter_luid", f"name the adapter once: adapter_index is "
                              f"{self.adapter_index} already", self.adapter_luid)
        for key in _OWNED:
            if key in self.provider_options:
                raise ConfigError(f"provider_options.{key}", "set the adapter with "
                                  "adapter_index or adapter_luid",
                                  self.provider_options[key])

    @property
    def luid(self) -> int | None:
        """:attr:`adapter_luid` as an integer."""
        return None if self.adapter_luid is None else parse_luid(self.adapter_luid)


def select_adapter(adapters: Sequence[DmlAdapter], options: DmlOptions,
                   field: str = "backend.options") -> DmlAdapter:
    """The adapter the options name, with its integration settled.

    Raises:
        StageRefused: no listed adapter matches, or the integration is unknown or
            contradicts what ORT reported.
    """
    listed = [a.to_json() for a in adapters]
    if options.luid is not None:
        chosen = next((a for a in adapters if a.luid == options.luid), None)
        if chosen is None:
            raise StageRefused(f"{field}.adapter_luid", f"no DirectML adapter has this LUID "
                               f"(listed: {listed})", options.adapter_luid)
    else:
        index = options.adapter_index or 0
        chosen = next((a for a in adapters if a.index == index), None)
        if chosen is None:
            raise StageRefused(f"{field}.adapter_index", f"no DirectML adapter has this "
                               f"index (listed: {listed})", index)
    stated = options.integration
    if stated == "auto":
        if chosen.integration is Integration.UNKNOWN:
            raise StageRefused(f"{field}.integration", f"ONNX Runtime did not report whether "
                               f"adapter {chosen.index} ({chosen.description}) is integrated "
                               "or discrete, so its memory pool is unknown; state it", stated)
        return chosen
    if chosen.integration is Integration.UNKNOWN:
        return attrs.evolve(chosen, integration=Integration(stated))
    if chosen.integration.value != stated:
        raise StageRefused(f"{field}.integration", f"ONNX Runtime reports adapter "
                           f"{chosen.index} as {chosen.integration.value}", stated)
    return chosen


def dml_load_config(options: DmlOptions | None, adapter: DmlAdapter) -> dict[str, Any]:
    """The worker's ``load`` configuration: DirectML on ``adapter``, then CPU."""
    config = base_load_config(PROVIDER, options or DmlOptions())
    config["providers"][0][1]["device_id"] = str(adapter.index)
    config["adapter"] = adapter.to_json()
    return config
