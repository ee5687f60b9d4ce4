"""BootConfig.from_dict checks each field by its name and type, whatever the field order."""

from __future__ import annotations

import dataclasses

import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.worker_protocol import BootConfig

BOOT = BootConfig("t" * 64, "m:f", 1, "p", "q", 1, 2, 3, 4, features=("cancel",), spin_us=5)


def test_a_boot_configuration_round_trips_through_its_json_form() -> None:
    assert BootConfig.from_json(BOOT.to_json()) == BOOT


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(BootConfig)])
def test_every_field_is_checked_and_named_when_mistyped(field: str) -> None:
    data = BOOT.to_dict()
    data[field] = {"not": "a value"}
    with pytest.raises(InvalidValue) as caught:
        BootConfig.from_dict(data)
    assert caught.value.field == f"boot.{field}"


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(BootConfig)
                                   if f.default is dataclasses.MISSING
                                   and f.default_factory is dataclasses.MISSING])
def test_a_missing_required_field_is_named(field: str) -> None:
    data = BOOT.to_dict()
    del data[field]
    with pytest.raises(InvalidValue, match="missing required key") as caught:
        BootConfig.from_dict(data)
    assert caught.value.field == f"boot.{field}"


def test_a_negative_count_and_an_unknown_key_are_refused_by_name() -> None:
    with pytest.raises(InvalidValue) as caught:
        BootConfig.from_dict({**BOOT.to_dict(), "spin_us": -1})
    assert caught.value.field == "boot.spin_us"
    with pytest.raises(InvalidValue, match="unknown key") as caught:
        BootConfig.from_dict({**BOOT.to_dict(), "spin": 1})
    assert caught.value.field == "boot.spin"


def test_optional_fields_take_their_defaults() -> None:
    data = {k: v for k, v in BOOT.to_dict().items()
            if k not in ("features", "spin_us", "shm_fds", "max_header_bytes")}
    assert BootConfig.from_dict(data) == dataclasses.replace(BOOT, features=(), spin_us=0)
