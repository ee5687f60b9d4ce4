"""Leaf checks for configuration values, shared by the cattrs hooks and the attrs validators.

Each check takes the raw value and returns the checked value or raises :class:`CheckError`,
which carries a reason and the offending value but no path: the structuring layer knows
where in the document the value sits and turns it into a :class:`~edge_core.errors.ConfigError`
with the full path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import attrs

from edge_contracts.devices import validate_pool_name
from edge_contracts.error_copies import whole_reduction
from edge_contracts.errors import ContractError
from edge_core.config.sizes import ByteSizeError, parse_byte_size
from edge_core.errors import ConfigError

__all__ = [
    "INTERNAL",
    "MAX_IO_BYTES",
    "MAX_REPLICAS",
    "OS_DOMAINS",
    "Check",
    "CheckError",
    "check_absolute_interpreter",
    "check_adapter_or_callable",
    "check_byte_size",
    "check_entry",
    "check_fraction",
    "check_identifier",
    "check_io_byte_size",
    "check_module_path",
    "check_os_domain",
    "check_pool_name",
    "check_positive_byte_size",
    "check_positive_int",
    "check_replicas",
    "check_text",
    "check_top_module",
    "validator",
]

INTERNAL = "edge_config_internal"
"""attrs field metadata key: the field is set by the loader, never read from a file."""

OS_DOMAINS: tuple[str, ...] = ("posix", "wsl", "windows")
"""Execution domains a route may name: a POSIX host, WSL 2, or native Windows."""

_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTRIBUTE = _MODULE
_TOP_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CheckError(Exception):
    """A leaf value failed its check; the caller attaches the path."""

    def __init__(self, reason: str, value: object, subpath: str = "") -> None:
        self.reason = reason
        self.value = value
        self.subpath = subpath
        super().__init__(f"{reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


@attrs.frozen
class Check:
    """``typing.Annotated`` marker: structure the raw value with ``fn`` (which may raise)."""

    fn: Callable[[Any], Any]


def check_text(value: object) -> str:
    """Return ``value`` if it is a non-empty string."""
    if not isinstance(value, str):
        raise CheckError("expected a string", value)
    if not value.strip():
        raise CheckError("must not be empty", value)
    return value


def check_identifier(value: object) -> str:
    """Return a stage or pipeline name: letters, digits, ``_``, ``.``, ``-``."""
    text = check_text(value)
    if _IDENTIFIER.fullmatch(text) is None:
        raise CheckError("expected letters, digits, '_', '.' or '-', starting alphanumeric", text)
    return text


def check_module_path(value: object) -> str:
    """Return a dotted Python module path such as ``mypkg.myplugin``."""
    text = check_text(value)
    if _MODULE.fullmatch(text) is None:
        raise CheckError("expected a dotted module path such as 'pkg.module'", text)
    return text


def check_top_module(value: object) -> str:
    """Return a top-level module or package name (no dots), as a route's ``stage`` lists."""
    text = check_text(value)
    if _TOP_MODULE.fullmatch(text) is None:
        raise CheckError("expected a top-level module name such as 'mypkg'", text)
    return text


def check_entry(value: object) -> str:
    """Return a worker entry ``package.module:factory``."""
    text = check_text(value)
    module, colon, attribute = text.partition(":")
    if not colon or _MODULE.fullmatch(module) is None or _TOP_MODULE.fullmatch(attribute) is None:
        raise CheckError("expected 'package.module:factory'", text)
    return text


def check_adapter_or_callable(value: object) -> str:
    """Return ``module:function`` (a callable to import) or an adapter (entry-point) name."""
    text = check_text(value)
    if ":" in text:
        module, _, attribute = text.partition(":")
        if _MODULE.fullmatch(module) is None or _ATTRIBUTE.fullmatch(attribute) is None:
            raise CheckError("expected 'package.module:function'", text)
        return text
    if _IDENTIFIER.fullmatch(text) is None:
        raise CheckError("expected 'package.module:function' or an adapter name", text)
    return text


def check_positive_int(value: object) -> int:
    """Return an integer of at least 1 (``bool`` is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckError("expected an integer", value)
    if value < 1:
        raise CheckError("must be at least 1", value)
    return value


MAX_REPLICAS = 256
"""The most replicas (worker processes) one stage may declare."""


def check_replicas(value: object) -> int:
    """Return a replica count: an integer from 1 to :data:`MAX_REPLICAS`."""
    count = check_positive_int(value)
    if count > MAX_REPLICAS:
        raise CheckError(f"must be at most {MAX_REPLICAS} (one worker process each)", value)
    return count


def check_byte_size(value: object) -> int:
    """Return a byte count given as an integer or a string such as ``"512 MiB"``."""
    try:
        return parse_byte_size(value)
    except ByteSizeError as exc:
        raise CheckError(exc.reason, value) from None


def check_positive_byte_size(value: object) -> int:
    """Return a byte count of at least one byte."""
    nbytes = check_byte_size(value)
    if nbytes < 1:
        raise CheckError("must be at least 1 byte", value)
    return nbytes


MAX_IO_BYTES = 2**62
"""The largest ``max_io_bytes`` a stage may declare: with its shared-memory headroom it
still fits the worker channel's 64-bit limits (what a worker would refuse only once
started)."""


def check_io_byte_size(value: object) -> int:
    """Return a ``max_io_bytes``: from one byte to :data:`MAX_IO_BYTES`."""
    nbytes = check_positive_byte_size(value)
    if nbytes > MAX_IO_BYTES:
        raise CheckError(f"must be at most {MAX_IO_BYTES} bytes (2**62, what the worker "
                         "channel's 64-bit limits carry)", value)
    return nbytes


def check_fraction(value: object) -> float:
    """Return a number in the half-open interval (0, 1] as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckError("expected a number in (0, 1]", value)
    number = float(value)
    if not math.isfinite(number) or not 0.0 < number <= 1.0:
        raise CheckError("must be in (0, 1]", value)
    return number


def check_os_domain(value: object) -> str:
    """Return ``value`` if it is one of :data:`OS_DOMAINS`."""
    text = check_text(value)
    if text not in OS_DOMAINS:
        raise CheckError(f"expected one of {', '.join(OS_DOMAINS)}", text)
    return text


def check_pool_name(value: object) -> str:
    """Return a pool name accepted by :func:`edge_contracts.devices.validate_pool_name`."""
    text = check_text(value)
    try:
        validate_pool_name(text)
    except ContractError as exc:
        raise CheckError(f"not a pool name: {exc.reason}", text) from None
    return text


def check_absolute_interpreter(value: object, os_domain: str | None = None) -> str:
    r"""Return an absolute interpreter path, in the form the route's OS domain uses.

    A ``windows`` route needs a Windows path (``C:\...\python.exe``), a ``posix`` or ``wsl``
    route a POSIX one; without a domain either form is accepted.
    """
    text = check_text(value)
    posix = PurePosixPath(text).is_absolute()
    windows = PureWindowsPath(text).is_absolute()
    if os_domain == "windows":
        absolute = windows
    elif os_domain in ("posix", "wsl"):
        absolute = posix
    else:
        absolute = posix or windows
    if not absolute:
        suffix = f" for os_domain {os_domain}" if os_domain else ""
        raise CheckError(f"not an absolute path{suffix}", text)
    return text


def validator(check: Callable[[Any], Any]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """Turn a leaf check into an attrs validator raising ``ConfigError(<field>, ...)``.

    Used so that values built in code obey the same rules as values read from a file.
    """

    def run(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        try:
            check(value)
        except CheckError as exc:
            raise ConfigError(attribute.name + exc.subpath, exc.reason, exc.value) from None

    return run
