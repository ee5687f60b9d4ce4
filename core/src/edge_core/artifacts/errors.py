"""Why an artifact bundle was refused: one :class:`~edge_core.errors.ManifestInvalid` subclass each.

Every error carries ``field`` (what was checked, e.g. ``manifest.files["model.onnx"]``),
``reason`` (the rule that was broken) and ``value`` (what was found), and renders as
``field: reason: value``.
"""

from __future__ import annotations

from edge_core.errors import ManifestInvalid

__all__ = [
    "BundleChanged",
    "BundleRefused",
    "DigestMismatch",
    "ManifestExists",
    "ManifestSchemaInvalid",
    "MemberMissing",
    "MemberPathRefused",
    "ReferenceRefused",
]


class BundleRefused(ManifestInvalid):
    """Base of the bundle refusals; names the field, the reason and the value.

    Attributes:
        field: what was checked, as a path into the manifest or the bundle.
        reason: the rule that was broken, naming the limit.
        value: the offending value as found.

    """

    field: str
    reason: str
    value: object

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")

    def to_dict(self) -> dict[str, object]:
        """The JSON-ready form used by ``edge manifest verify --json``."""
        return {
            "kind": type(self).__name__,
            "field": self.field,
            "reason": self.reason,
            "value": self.value if isinstance(self.value, (str, int)) else repr(self.value),
        }


class ManifestSchemaInvalid(BundleRefused):
    """The manifest file is missing, unreadable, not JSON, or breaks the manifest schema."""


class ManifestExists(BundleRefused):
    """The bundle already has a manifest and creating one was not asked to replace it."""


class MemberPathRefused(BundleRefused):
    """A member path is not a safe relative path, resolves outside the bundle, or is not a file."""


class MemberMissing(BundleRefused):
    """A file listed in the manifest is not in the bundle."""


class DigestMismatch(BundleRefused):
    """A member's sha256 differs from the manifest's (a tampered or replaced file)."""


class ReferenceRefused(BundleRefused):
    """A referenced file is not in the verified set, or cannot be read safely.

    Referenced files: the graph, example inputs, expected outputs and ONNX external
    data; unsafe reads: e.g. an ``.npz`` that needs pickle.
    """


class BundleChanged(BundleRefused):
    """A member or the manifest changed while, or after, it was verified."""
