"""One verification per bundle inside a scope, shared by its replicas; never a weaker one.

The verifications are counted by wrapping the real ``verify_bundle`` that
:mod:`edge_core.artifacts.shared_verification` calls (deterministic, no timing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_core.artifacts import (
    DigestMismatch,
    VerifiedBundle,
    verification_scope,
    verify_bundle,
    verify_once,
)
from edge_core.artifacts import shared_verification as shared_module

from .bundles import write_bundle


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directory of every full verification the shared path runs."""
    calls: list[Path] = []
    real: Callable[..., VerifiedBundle] = shared_module.verify_bundle

    def counting(directory: Any, **options: Any) -> VerifiedBundle:
        calls.append(Path(directory))
        return real(directory, **options)

    monkeypatch.setattr(shared_module, "verify_bundle", counting)
    return calls


def test_two_replicas_in_one_scope_share_one_verification(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    directory = write_bundle(tmp_path / "b")
    with verification_scope() as scope:
        first = verify_once(directory, staging_root=staging_root)
        second = verify_once(directory, staging_root=staging_root)
    assert counted == [directory]
    assert (scope.verified, scope.shared) == (1, 1)
    assert first is not second
    assert first.describe() == second.describe()
    assert first.members == second.members
    assert first.staged and first.directory == second.directory
    first.cleanup()  # one replica retires: the other's copy stays
    assert first.cleaned_up and not second.cleaned_up
    assert second.graph.read_bytes() == (directory / "model.onnx").read_bytes()
    second.ensure_unchanged()
    second.cleanup()  # the last user: the copy goes (staging_root checks it is empty)
    assert not second.directory.exists()


def test_outside_a_scope_every_load_verifies(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    directory = write_bundle(tmp_path / "b")
    for _ in range(2):
        verify_once(directory, staging_root=staging_root).cleanup()
    assert counted == [directory, directory]


def test_different_bundles_or_staging_choices_are_verified_apart(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    one, two = write_bundle(tmp_path / "one"), write_bundle(tmp_path / "two")
    with verification_scope():
        handles = [verify_once(one, staging_root=staging_root),
                   verify_once(two, staging_root=staging_root),
                   verify_once(one, stage=False)]
    assert counted == [one, two, one]
    assert [h.staged for h in handles] == [True, True, False]
    for handle in handles:
        handle.cleanup()


def test_a_member_changed_between_replicas_is_refused_as_a_fresh_verification_refuses(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    directory = write_bundle(tmp_path / "b")
    with verification_scope():
        first = verify_once(directory, staging_root=staging_root)
        with (directory / "weights.bin").open("r+b") as handle:  # same size, new bytes
            handle.write(b"\xff")
        with pytest.raises(DigestMismatch) as shared:
            verify_once(directory, staging_root=staging_root)
        first.cleanup()
    with pytest.raises(DigestMismatch) as fresh:
        verify_bundle(directory, staging_root=staging_root)
    assert (shared.value.field, shared.value.reason, shared.value.value) == (
        fresh.value.field, fresh.value.reason, fresh.value.value)
    assert counted == [directory, directory]


def test_replicas_starting_together_wait_for_the_one_verification(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    directory = write_bundle(tmp_path / "b")
    got: list[VerifiedBundle] = []
    with verification_scope() as scope:
        threads = [threading.Thread(
            target=lambda: got.append(verify_once(directory, staging_root=staging_root)))
            for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(got) == 4 and counted == [directory]
    assert (scope.verified, scope.shared) == (1, 3)
    for handle in got:
        handle.cleanup()


def test_a_failed_verification_is_not_kept(
    tmp_path: Path, staging_root: Path, counted: list[Path]
) -> None:
    directory = write_bundle(tmp_path / "b")
    (directory / "weights.bin").write_bytes(b"tampered")
    with verification_scope():
        for _ in range(2):
            with pytest.raises(DigestMismatch):
                verify_once(directory, staging_root=staging_root)
    assert counted == [directory, directory]


def test_an_unused_verification_is_removed_when_the_scope_ends(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b")
    with verification_scope():
        verify_once(directory, staging_root=staging_root).cleanup()
        assert list(staging_root.iterdir())  # the scope's own handle keeps the copy
    assert not list(staging_root.iterdir())
