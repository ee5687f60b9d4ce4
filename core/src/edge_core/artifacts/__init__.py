"""Artifact bundles: creating manifests, and verifying a bundle before any worker loads it.

A bundle is a directory with ``edge-manifest.json`` at its root listing every file with
its sha256, and metadata naming the graph, example inputs and reference outputs.

- :func:`create_manifest` / :func:`build_manifest`: list and hash a directory, check it,
  write its manifest.
- :func:`verify_bundle`: refuse anything unsafe or changed, and return a
  :class:`VerifiedBundle` whose ``directory`` the worker loads from (a private copy of
  the verified bytes by default). Call :meth:`VerifiedBundle.ensure_unchanged` right
  before the load and :meth:`VerifiedBundle.cleanup` (or use ``with``) afterwards.
- :func:`verify_once`: the same, shared by every load of one unchanged bundle inside a
  :func:`verification_scope` (the opener's, so replicas verify their bundle once).
- :mod:`edge_core.artifacts.pins`: a stage's restart loads the bundle the stage opened
  with (the staged copy kept since), or is refused with ``BundleChanged``.

Every refusal is a :class:`~edge_core.errors.ManifestInvalid` subclass from
:mod:`edge_core.artifacts.errors`. Importing this package does not import numpy.
"""

from __future__ import annotations

from edge_core.artifacts.bundle import VerifiedBundle
from edge_core.artifacts.create import CreatedManifest, build_manifest, create_manifest
from edge_core.artifacts.errors import (
    BundleChanged,
    BundleRefused,
    DigestMismatch,
    ManifestExists,
    ManifestSchemaInvalid,
    MemberMissing,
    MemberPathRefused,
    ReferenceRefused,
)
from edge_core.artifacts.onnx_refs import ExternalRef, external_refs
from edge_core.artifacts.shared_verification import verification_scope, verify_once
from edge_core.artifacts.verify import verify_bundle

__all__ = [
    "BundleChanged",
    "BundleRefused",
    "CreatedManifest",
    "DigestMismatch",
    "ExternalRef",
    "ManifestExists",
    "ManifestSchemaInvalid",
    "MemberMissing",
    "MemberPathRefused",
    "ReferenceRefused",
    "VerifiedBundle",
    "build_manifest",
    "create_manifest",
    "external_refs",
    "verification_scope",
    "verify_bundle",
    "verify_once",
]
