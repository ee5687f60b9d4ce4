"""The exception hierarchy of edge-core: one base class, subclasses named for what went wrong.

Every message names the field (or subject), the reason and the offending value, in the
form ``field: reason: value``, so that a refusal can be acted on without a debugger; a
problem that has no value (a required key that is missing) reads ``field: reason``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the CLI imports this module and starts without typing
if TYPE_CHECKING:
    from typing import Final


class _NoValue:
    """The type of :data:`NO_VALUE`."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Final = _NoValue()
"""The ``value`` of a :class:`ConfigError` about no value at all (a key that is missing).

Distinct from ``None``, which is a value a JSON or YAML document can hold (``null``).
"""


MAX_SHOWN_VALUE = 300
"""Most characters of a value a :class:`ConfigError`'s message shows (its ``repr``, cut)."""


def shown_value(value: object) -> str:
    """``repr(value)``, cut to :data:`MAX_SHOWN_VALUE` characters with the length it had.

    A message stays one readable line whatever the document held (a table nested a
    thousand deep, a megabyte string); the error's ``value`` keeps the whole value.
    """
    text = repr(value)
    if len(text) <= MAX_SHOWN_VALUE:
        return text
    return f"{text[:MAX_SHOWN_VALUE]}... ({len(text)} characters)"


def field_message(path: str, reason: str, value: object = NO_VALUE) -> str:
    """``path: reason: value`` (the value as :func:`shown_value` shows it), or ``path: reason``.

    The message of an error about one field: :class:`ConfigError`'s, and the runtime's
    about a value a pipeline's own code produced (a transform's return).
    """
    return f"{path}: {reason}" if value is NO_VALUE else f"{path}: {reason}: {shown_value(value)}"


class EdgeError(Exception):
    """Base class of every error raised by edge-core.

    ``str()`` is the whole message; :attr:`summary` and :attr:`detail` split it for a
    one-line report (the command line's): what it is, and what only ``--debug`` shows.

    ``copy.copy`` and ``copy.deepcopy`` keep an error whole: its type, ``args`` and every
    attribute (see :meth:`__reduce__`), whatever arguments its ``__init__`` takes.
    """

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes, without calling ``__init__`` again.

        The built-in reduction calls ``type(self)(*self.args)``, which fails for an error
        whose ``__init__`` takes other arguments than its message (most edge errors), and
        would run the constructor's checks and derivations a second time
        (:func:`~edge_contracts.error_copies.whole_reduction`).
        """
        # where used: a plain ``edge plugins`` imports this module, and no edge_contracts
        from edge_contracts.error_copies import whole_reduction

        return whole_reduction(self)

    @property
    def summary(self) -> str:
        """The error in one line, without its :attr:`detail`."""
        return " ".join(str(self).split("\n"))

    @property
    def detail(self) -> str | None:
        """What a one-line report leaves out (a worker's traceback); None for most errors."""
        return None


def stage_label(stage_id: str | None) -> str:
    """What follows a path into the file that lies in a stage: `` (stage 'classify')``.

    A path into the pipeline file names a stage by its position, as the file lists it
    (``stages[0].backend.name``); the label adds the stage's id, the name a running stage's
    errors give it (``stages[classify].numerics``). Empty for a stage without a known id.
    """
    return f" (stage {stage_id!r})" if stage_id else ""


class ConfigError(EdgeError, ValueError):
    """A configuration value is invalid; the message carries its full path and value.

    The value is shown as its ``repr`` cut to :data:`MAX_SHOWN_VALUE` characters
    (:func:`shown_value`); ``value`` holds it whole.

    Without a ``value`` (it is :data:`NO_VALUE`) the message is ``path: reason`` alone.
    ``stage`` is the id of the stage ``path`` lies in, when known: :attr:`located` is the
    message with it after the path (:func:`stage_label`), as the ``edge`` commands show
    it: ``stages[0].backend.name (stage 'classify'): reason: value``.
    """

    def __init__(self, path: str, reason: str, value: object = NO_VALUE, *,
                 stage: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.value = value
        self.stage = stage
        super().__init__(field_message(path, reason, value))

    def _shown(self) -> str:
        return "" if self.value is NO_VALUE else f": {shown_value(self.value)}"

    @property
    def located(self) -> str:
        """The message, the stage's id after the path (the message itself without one)."""
        return f"{self.path}{stage_label(self.stage)}: {self.reason}{self._shown()}"


class PluginError(EdgeError):
    """A plugin could not be loaded, or broke the hook contract."""


class BackendUnavailable(EdgeError):
    """A stage names a backend that no plugin provides, or whose probe says unavailable."""


class ResourceUnavailable(EdgeError):
    """Admission refused: a pool, an in-flight slot or a retained-result slot is exhausted."""


class PlacementRefused(EdgeError):
    """The warm-up placement gate refused a stage (fallback, split, unverified placement)."""


class ManifestInvalid(EdgeError):
    """An artifact bundle failed verification (schema, path, hash, membership)."""


class WorkerError(EdgeError):
    """A worker process misbehaved: failed bootstrap, broke protocol, or reported an error."""


class WorkerLost(WorkerError):
    """A worker process died or its channel closed while work was in flight."""


class StageClosed(EdgeError):
    """A stage refuses work: it was cancelled non-preemptively, retired or never loaded."""


class DeadlineExceeded(EdgeError, TimeoutError):
    """A call did not finish within its deadline (``deadline_s`` or a stage's ``call_timeout_s``).

    Also a :class:`TimeoutError`, so that code catching the built-in still catches it; every
    timeout edge-core raises is this type (or a subclass), never the bare built-in.
    """
