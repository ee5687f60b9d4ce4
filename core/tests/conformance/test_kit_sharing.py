"""Consecutive stage checks share one open pipeline while each leaves it whole.

Real echo workers throughout; the leak fixture of this folder checks that nothing (process,
segment, descriptor) outlives a test, shared pipelines included.
"""

from __future__ import annotations

import pytest

from edge_core.plugins import load_plugins
from edge_core.testing.checks import CHECKS, SHARED_CHECKS
from edge_core.testing.harness import OpenStage, first_stage, gone, shared, worker_identity
from edge_core.testing.results import Status
from edge_core.testing.runner import run_backend, run_check
from edge_core.testing.subject import Subject, prepare

ECHO = {"EDGE_PLUGINS": "echo"}


def held(subject: Subject) -> OpenStage:
    """The pipeline the subject's share holds now (there must be one)."""
    stage = subject.share.held
    assert isinstance(stage, OpenStage)
    return stage


def test_the_shared_checks_run_consecutively_in_the_kits_order() -> None:
    order = list(CHECKS)
    places = sorted(order.index(name) for name in SHARED_CHECKS)
    assert places == list(range(places[0], places[0] + len(places)))


@pytest.mark.parametrize("backend", ["echo", "echo-preemptible"])
def test_consecutive_shared_checks_run_on_one_worker_and_the_last_closes_it(
    backend: str,
) -> None:
    subject = prepare(load_plugins(env=ECHO), backend)
    try:
        names = [name for name in CHECKS if name in SHARED_CHECKS]
        first = run_check(subject, names[0], keep_open=True)
        assert first.status is Status.PASSED, first.detail
        lent = held(subject)
        worker = worker_identity(first_stage(lent.pipeline))
        for name in names[1:-1]:
            result = run_check(subject, name, keep_open=True)
            assert result.status is Status.PASSED, (name, result.detail)
            assert held(subject) is lent, name  # the same pipeline, the same worker
            assert worker_identity(first_stage(lent.pipeline)) == worker
        last = run_check(subject, names[-1])  # the next check does not share: it closes
        assert last.status is Status.PASSED, last.detail
        assert subject.share.held is None
        assert gone(worker)
    finally:
        subject.cleanup()


def test_a_check_that_does_not_share_closes_a_pipeline_left_open_first() -> None:
    subject = prepare(load_plugins(env=ECHO), "echo")
    try:
        assert run_check(subject, "stale_ack_frees_nothing", keep_open=True).status \
            is Status.PASSED
        lent = held(subject)
        worker = worker_identity(first_stage(lent.pipeline))
        retire = run_check(subject, "retire_verified")
        assert retire.status is Status.PASSED, retire.detail
        assert subject.share.held is None and gone(worker)
    finally:
        subject.cleanup()


def test_a_pipeline_left_holding_work_is_closed_and_the_next_check_opens_a_fresh_one() -> None:
    subject = prepare(load_plugins(env=ECHO), "echo")
    stage = subject.stage
    assert stage is not None
    try:
        subject.share.keep_open = True
        with shared(subject, "misbehaving") as pipeline:  # leaves a request unacknowledged
            runtime = first_stage(pipeline)
            worker = worker_identity(runtime)
            runtime.submit(stage.inputs, params=stage.params).result()
            assert runtime.outstanding == 1
        assert subject.share.held is None  # not lent on: closed, judged as opened() does
        assert gone(worker)
        result = run_check(subject, "cancel_finished_call", keep_open=True)
        assert result.status is Status.PASSED, result.detail
        assert worker_identity(first_stage(held(subject).pipeline)) != worker
    finally:
        subject.cleanup()


def fail_inside(subject: Subject, seen: list[tuple[int, float]]) -> None:
    """A check body that raises on the shared pipeline, after noting its worker."""
    with shared(subject, "failing") as pipeline:
        seen.append(worker_identity(first_stage(pipeline)))
        raise RuntimeError("the check broke")


def test_a_failed_check_never_lends_its_pipeline_to_the_next() -> None:
    subject = prepare(load_plugins(env=ECHO), "echo")
    try:
        subject.share.keep_open = True
        seen: list[tuple[int, float]] = []
        with pytest.raises(RuntimeError, match="the check broke"):
            fail_inside(subject, seen)
        (worker,) = seen
        assert subject.share.held is None and gone(worker)
    finally:
        subject.cleanup()


@pytest.mark.slow
def test_run_backend_reports_every_check_as_before_and_leaves_nothing_open() -> None:
    report = run_backend(load_plugins(env=ECHO), "echo-preemptible")
    failures = [f"{r.check}: {r.detail}" for r in report.results if r.status is Status.FAILED]
    assert not failures, failures
    assert [r.check for r in report.results] == list(CHECKS)


def test_an_empty_selection_of_checks_runs_nothing() -> None:
    report = run_backend(load_plugins(env=ECHO), "echo", [])
    assert report.results == ()
