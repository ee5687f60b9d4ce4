"""Routes: which interpreter runs a worker, which entry it serves, from which OS domain.

A :class:`Route` is checked when it is built: an interpreter that is not an absolute path
to an executable file, or an entry that is not ``package.module:factory``, is refused with
:class:`~edge_core.host.errors.RouteRefused` naming the field, the reason and the value.
The default route of a CPU backend (:meth:`Route.default`) is the controller's own
interpreter. A *foreign* route (any other interpreter) gets ``edge_contracts`` and the
packages named in :attr:`Route.stage` copied into a private directory that is put on the
worker's ``PYTHONPATH`` (see :mod:`edge_core.host.staging`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from edge_contracts.devices import ExecutionDomain
from edge_core.host.errors import RouteRefused

__all__ = ["Route", "controller_domain"]

_ENTRY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MODULE = re.compile(r"^[A-Za-z_][\w]*$")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def controller_domain() -> ExecutionDomain:
    """Return the OS domain the controller itself runs in."""
    if os.name == "nt":
        return ExecutionDomain.WINDOWS
    if os.name == "posix":
        try:
            release = Path("/proc/sys/kernel/osrelease").read_text().lower()
        except OSError:
            release = ""
        return ExecutionDomain.WSL if "microsoft" in release else ExecutionDomain.POSIX
    return ExecutionDomain.UNKNOWN  # pragma: no cover


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _check_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise RouteRefused(
            f"route.{attribute.name}", "must match [A-Za-z0-9][A-Za-z0-9_.-]*", value
        )


def _check_interpreter(_: object, __: attrs.Attribute[str], value: str) -> None:
    field = "route.interpreter"
    if not isinstance(value, str) or not os.path.isabs(value):
        raise RouteRefused(field, "must be an absolute path", value)
    if not os.path.exists(value):
        raise RouteRefused(field, "does not exist", value)
    if not os.path.isfile(value):
        raise RouteRefused(field, "is not a file", value)
    if not os.access(value, os.X_OK):
        raise RouteRefused(field, "is not executable", value)


def _check_entry(_: object, __: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _ENTRY.match(value):
        raise RouteRefused("route.entry", "must be 'package.module:factory'", value)


def _check_stage(_: object, __: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    for i, name in enumerate(value):
        if not isinstance(name, str) or not _MODULE.match(name):
            raise RouteRefused(f"route.stage[{i}]", "must be a top-level module name", name)


def _env_pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((k, v) for k, v in items))


def _check_env(
    _: object, __: attrs.Attribute[tuple[tuple[str, str], ...]], value: tuple[tuple[str, str], ...]
) -> None:
    for name, text in value:
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None:
            raise RouteRefused(f"route.env.{name}", "must be a variable name", name)
        if name == "PYTHONPATH":
            raise RouteRefused(f"route.env.{name}", "is built from route.python_path", name)
        if not isinstance(text, str) or "\0" in text:
            raise RouteRefused(f"route.env.{name}", "must be a string without NUL", text)


def _check_paths(_: object, __: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    for i, path in enumerate(value):
        if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isdir(path):
            raise RouteRefused(
                f"route.python_path[{i}]", "must be an existing absolute directory", path
            )


@attrs.frozen
class Route:
    """How to start one backend's worker.

    Attributes:
        name: a short label for reports.
        interpreter: absolute path of the Python that runs the worker.
        entry: ``package.module:factory``; the worker calls ``factory()`` for its handler.
        os_domain: the OS domain the interpreter lives in; only the controller's own
            domain can be started today.
        stage: top-level packages (or modules) copied next to ``edge_contracts`` into the
            private staging directory of a foreign interpreter.
        python_path: extra absolute directories put on the worker's ``PYTHONPATH``.
        env: variables set in the worker's environment, as given (``(name, value)``
            pairs, sorted; a mapping is accepted). Everything else the worker sees comes
            from the allowlist of :mod:`edge_core.host.environment`.

    """

    name: str = attrs.field(validator=_check_name)
    interpreter: str = attrs.field(validator=_check_interpreter)
    entry: str = attrs.field(validator=_check_entry)
    os_domain: ExecutionDomain = attrs.field(factory=controller_domain, converter=ExecutionDomain)
    stage: tuple[str, ...] = attrs.field(default=(), converter=_strings, validator=_check_stage)
    python_path: tuple[str, ...] = attrs.field(
        default=(), converter=_strings, validator=_check_paths
    )
    env: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_env_pairs, validator=_check_env
    )

    @classmethod
    def default(
        cls,
        name: str,
        entry: str,
        *,
        stage: tuple[str, ...] = (),
        python_path: tuple[str, ...] = (),
    ) -> Route:
        """Build the route of a CPU backend: the controller's own interpreter and domain."""
        return cls(
            name=name,
            interpreter=sys.executable,
            entry=entry,
            stage=stage,
            python_path=python_path,
        )

    @property
    def foreign(self) -> bool:
        """True when the worker runs in an interpreter other than the controller's."""
        return _venv_of(self.interpreter) != os.path.realpath(sys.prefix)

    @property
    def module(self) -> str:
        """The module part of :attr:`entry`."""
        return self.entry.partition(":")[0]

    def to_dict(self) -> dict[str, object]:
        """Plain form for execution plans."""
        return {
            "name": self.name,
            "interpreter": self.interpreter,
            "entry": self.entry,
            "os_domain": self.os_domain.value,
            "stage": list(self.stage),
            "python_path": list(self.python_path),
            "env": [name for name, _ in self.env],  # names only: values may be private
        }


def _venv_of(interpreter: str) -> str:
    """Return the environment prefix an interpreter belongs to (its ``bin/``'s parent)."""
    return os.path.realpath(Path(interpreter).parent.parent)
