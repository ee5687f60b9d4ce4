from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from edge_core import hookimpl
from edge_core.backend import BackendInfo, CancelOutcome, ProbeReport
from edge_core.binding import bind_owner
from edge_core.errors import BackendUnavailable, ConfigError, PluginError
from edge_core.plugins import load_plugins


class Owner:
    """A minimal owner of backend 'toy' implementing every required owner hook."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="toy", kinds=["graph"])]

    @hookimpl
    def edge_reserve(self, stage: Any) -> Mapping[str, int]:
        return {"machine:ram": 1}

    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        return ("loaded", stage)

    @hookimpl
    def edge_warmup_placement(self, loaded: Any) -> Any:
        return None

    @hookimpl
    def edge_call(self, loaded: Any, request: Any, inputs: Any) -> Iterator[Any]:
        self.calls.append(f"call {request}")
        return iter(())

    @hookimpl
    def edge_retire(self, deadline_s: float) -> str:  # takes a subset of the spec's args
        return f"retired within {deadline_s}"


class Other:
    """Owns backend 'other'; its edge_call must never run for 'toy' stages."""

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="other", kinds=["graph"], preemptible=True)]

    @hookimpl
    def edge_call(self, loaded: Any, request: Any, inputs: Any) -> Iterator[Any]:
        raise AssertionError("the other plugin was called")


def test_owner_hooks_are_bound_once_to_the_owner() -> None:
    owner = Owner()
    plugins = load_plugins(objects={"owner": owner, "other": Other()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    assert binding.plugin == "owner"
    assert binding.backend.name == "toy"
    # The hot path is the plugin's own bound method: no pluggy dispatch in between.
    assert binding.call == owner.edge_call
    list(binding.call("L", "r1", {}))
    assert owner.calls == ["call r1"]
    assert binding.reserve("S") == {"machine:ram": 1}


def test_an_implementation_taking_fewer_arguments_is_adapted() -> None:
    plugins = load_plugins(objects={"owner": Owner()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    assert binding.retire("loaded", 2.5) == "retired within 2.5"


def test_optional_owner_hooks_have_safe_defaults() -> None:
    plugins = load_plugins(objects={"owner": Owner()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    assert binding.cancel("loaded", "r1", 3) is CancelOutcome.RETIRE_REQUIRED
    assert binding.config_defaults("toy") is None
    assert binding.validate_stage("toy", {}, "stages[0].backend") is None
    with pytest.raises(ConfigError, match=r"stages\[0\]\.backend: backend 'toy' takes no options"):
        binding.validate_stage("toy", {"threads": 2}, "stages[0].backend")


def test_unknown_backend_names_what_is_installed() -> None:
    plugins = load_plugins(objects={"owner": Owner()}, env={"EDGE_PLUGINS": ""})
    with pytest.raises(BackendUnavailable, match=r"'nope' \(available: \['toy'\]\)"):
        bind_owner(plugins, "nope", env={})


class WrongReserve(Owner):
    """Owns 'toy' but answers edge_reserve with a bare number of bytes."""

    @hookimpl
    def edge_reserve(self, stage: Any) -> Any:
        return 5


def test_a_reserve_answer_that_is_not_a_mapping_is_a_plugin_error_naming_the_plugin() -> None:
    plugins = load_plugins(objects={"mine": WrongReserve()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    with pytest.raises(PluginError, match=r"plugin 'mine': edge_reserve for backend 'toy' "
                       r"returned 5 \(int\), not a mapping of pool to bytes"):
        binding.reserve("S")


class NoneLoad(Owner):
    """Owns 'toy'; its edge_load forgets to return what it loaded."""

    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        return None


def test_a_load_returning_none_is_a_plugin_error_naming_the_plugin() -> None:
    plugins = load_plugins(objects={"mine": NoneLoad()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    with pytest.raises(PluginError, match=r"^plugin 'mine': edge_load for backend 'toy' "
                       r"returned None, not the loaded stage$"):
        binding.load("S")


class ForgetfulLoad(Owner):
    """Owns 'toy'; its edge_load starts the echo worker, then returns None (or raises)."""

    def __init__(self, then: str) -> None:
        super().__init__()
        self.then = then
        self.pids: list[int] = []

    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        from edge_echo import plugin as echo

        loaded = echo.edge_load(stage)
        self.pids.append(loaded.client.identity.pid)
        if self.then == "raise":
            raise RuntimeError("failed after starting its worker")
        return None


@pytest.mark.parametrize("then", ["none", "raise"])
def test_a_load_that_fails_after_starting_a_worker_retires_it_there_and_then(
        then: str) -> None:
    """edge_load returning None (or raising) after its worker started leaves no process.

    Nothing held the worker's handle: it lived until the controller exited, while the
    stage's reservation was given back. Now the binding retires every worker the hook
    started, and the error carries the outcome that settles the reservation.
    """
    import psutil

    from edge_core.stage import RETIRE_OUTCOME_ATTR, StageContext
    from edge_core.testing.leaks import leaks_since, snapshot

    owner = ForgetfulLoad(then)
    plugins = load_plugins(objects={"mine": owner}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    before = snapshot()
    expected = (r"^plugin 'mine': edge_load for backend 'toy' returned None, not the loaded "
                r"stage \(the 1 worker it started was retired\)$" if then == "none"
                else r"^failed after starting its worker$")
    with pytest.raises(Exception, match=expected) as failed:
        binding.load(StageContext(pipeline="p", stage_id="s", backend="toy"))
    assert isinstance(failed.value, PluginError if then == "none" else RuntimeError)
    (pid,) = owner.pids
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    outcome = getattr(failed.value, RETIRE_OUTCOME_ATTR)
    assert outcome.verified is True and pid in {p.pid for p in outcome.tree}
    report = leaks_since(before, grace_s=0.5)
    assert not report.children, report.describe()


class RaisingValidator(Owner):
    """Owns 'toy'; its options check raises a bare ValueError."""

    @hookimpl
    def edge_validate_stage(self, backend: str, section: Any, path: str) -> Any:
        raise ValueError("threads must be even")


def test_an_options_check_raising_a_bare_error_is_a_config_error_at_the_options_path() -> None:
    plugins = load_plugins(objects={"mine": RaisingValidator()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    with pytest.raises(ConfigError) as raised:
        binding.validate_stage("toy", {"threads": 3}, "stages[0].backend.options")
    assert raised.value.path == "stages[0].backend.options"
    assert raised.value.reason == ("plugin 'mine': edge_validate_stage raised ValueError: "
                                   "threads must be even")
    assert raised.value.value == {"threads": 3}


class DictProbe(Owner):
    """Owns 'toy' but answers edge_probe with one report's fields, not a list of reports."""

    @hookimpl
    def edge_probe(self) -> Any:
        return {"backend": "toy", "available": True}


def test_a_probe_answer_that_is_not_a_list_of_reports_refuses_the_stage_naming_the_plugin(
        ) -> None:
    from edge_core.config import load_pipeline
    from edge_core.probe import probe_all
    from edge_core.runtime.opener import resolve_slots

    plugins = load_plugins(objects={"mine": DictProbe()}, env={"EDGE_PLUGINS": ""})
    answer = plugins.probe("mine", timeout_s=5.0)
    assert answer.result is None
    assert answer.error == ("edge_probe returned dict {'backend': 'toy', 'available': True}, "
                            "not a list of ProbeReport")
    config = load_pipeline({"name": "t", "stages": [{"id": "s", "backend": {"name": "toy"}}]})
    with pytest.raises(BackendUnavailable, match=r"stages\[0\]\.backend\.name \(stage 's'\): "
                       r"probe of plugin 'mine' failed \(edge_probe returned dict "):
        resolve_slots(config, plugins, 0)
    row = probe_all(plugins)["backends"][0]
    assert (row["backend"], row["available"]) == ("toy", False)
    assert "not a list of ProbeReport" in row["reason"]


class MixedProbe(Owner):
    """Owns 'toy' and answers edge_probe with a good report and one that is not a report."""

    @hookimpl
    def edge_probe(self) -> Any:
        return [ProbeReport(backend="toy", available=True), {"backend": "toy"}]


def test_a_probe_answer_mixing_reports_and_others_is_refused_whole_by_probe_and_open() -> None:
    """edge probe and the open agree: the good report of a mixed answer does not make its
    backend available in the one while the other refuses the stage."""
    from edge_core.config import load_pipeline
    from edge_core.probe import probe_all
    from edge_core.runtime.opener import resolve_slots

    plugins = load_plugins(objects={"mine": MixedProbe()}, env={"EDGE_PLUGINS": ""})
    config = load_pipeline({"name": "t", "stages": [{"id": "s", "backend": {"name": "toy"}}]})
    with pytest.raises(BackendUnavailable, match=r"probe of plugin 'mine' failed "
                       r"\(edge_probe returned a non-ProbeReport: \{'backend': 'toy'\}"):
        resolve_slots(config, plugins, 0)
    probed = probe_all(plugins)
    (row,) = probed["backends"]
    assert (row["backend"], row["available"]) == ("toy", False)
    assert row["reason"] == ("probe failed: edge_probe returned a non-ProbeReport: "
                             "{'backend': 'toy'}")
    assert [e["plugin"] for e in probed["plugin_errors"]] == ["mine"]


TOY = BackendInfo(name="toy", kinds=["graph"])


class WrongBackends(Owner):
    """Owns 'toy' by its hooks, but answers edge_backends with something else than a list."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer

    @hookimpl
    def edge_backends(self) -> Any:
        return self.answer

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="toy", available=True)]


@pytest.mark.parametrize(("answer", "problem"), [
    ({"toy": TOY}, "edge_backends returned dict {'toy': BackendInfo(name='toy', "),
    (TOY, "edge_backends returned BackendInfo BackendInfo(name='toy', "),
    ("toy", "edge_backends returned str 'toy', not a list of BackendInfo"),
    ([TOY, "other"], "edge_backends returned a list holding str 'other', not a list of "
                     "BackendInfo"),
])
def test_a_backends_answer_that_is_not_a_list_of_backend_info_is_refused_naming_the_plugin(
        answer: Any, problem: str) -> None:
    """Its plugin serves nothing, and edge probe reports none of its rows as available.

    Before, a mapping or a string was read item by item (its keys, its letters: the error
    named the last one, ``'y'``), a single BackendInfo was an internal TypeError in every
    command, a list with one stray item still declared the good ones, and ``edge probe``
    listed the plugin's own report of 'toy' as available in every case.
    """
    from edge_core.probe import probe_all

    plugins = load_plugins(objects={"mine": WrongBackends(answer)}, env={"EDGE_PLUGINS": ""})
    record = plugins.record("mine")
    assert record.error is not None and record.error.startswith(problem)
    assert record.error.endswith("not a list of BackendInfo")
    assert record.backends == () and "toy" not in plugins.backends
    with pytest.raises(BackendUnavailable, match=r"plugins that failed to load: mine "
                       r"\(edge_backends returned "):
        bind_owner(plugins, "toy", env={})
    probed = probe_all(plugins)
    (row,) = probed["backends"]
    assert (row["backend"], row["plugin"], row["available"]) == ("toy", "mine", False)
    assert row["reason"] == f"plugin 'mine' does not serve it: {record.error}"
    assert probed["plugin_errors"] == [{"plugin": "mine", "error": record.error,
                                        "named_by": None}]
    with pytest.raises(PluginError, match=r"1 plugin\(s\) failed to load: mine: "
                       r"edge_backends returned "):
        load_plugins(objects={"mine": WrongBackends(answer)}, env={"EDGE_PLUGINS": ""},
                     strict=True)


def test_a_probe_report_on_a_backend_its_plugin_does_not_serve_is_not_available() -> None:
    """A clash (two plugins declare 'toy': neither serves it) or a backend never declared."""
    from edge_core.probe import probe_all

    plugins = load_plugins(objects={"a": WrongBackends([TOY]), "b": WrongBackends([TOY]),
                                    "c": WrongBackends(None)}, env={"EDGE_PLUGINS": ""})
    rows = probe_all(plugins)["backends"]
    assert [(r["plugin"], r["available"]) for r in rows] == [("a", False), ("b", False),
                                                             ("c", False)]
    clash = plugins.record("a").error
    assert clash is not None and "is declared by plugins 'a' and 'b'" in clash
    assert [r["reason"] for r in rows] == [
        f"plugin 'a' does not serve it: {clash}", f"plugin 'b' does not serve it: {clash}",
        "plugin 'c' does not declare backend 'toy' (edge_backends)"]


def test_owner_missing_a_required_hook_is_a_plugin_error() -> None:
    plugins = load_plugins(objects={"other": Other()}, env={"EDGE_PLUGINS": ""})
    with pytest.raises(PluginError, match="does not implement edge_reserve"):
        bind_owner(plugins, "other", env={})


def test_a_backend_declared_by_two_plugins_is_served_by_neither() -> None:
    plugins = load_plugins(objects={"a": Owner(), "b": Owner(), "c": Other()},
                           env={"EDGE_PLUGINS": ""})
    for name in ("a", "b"):  # whichever sorts first would have taken it, in silence
        assert plugins.record(name).backends == ()
        assert plugins.record(name).error == ("backend: 'toy' is declared by plugins 'a' "
                                              "and 'b': neither serves it (uninstall or "
                                              "rename one)")
    assert "toy" not in plugins.backends
    assert plugins.record("c").backends == ("other",) and plugins.record("c").error is None
    with pytest.raises(BackendUnavailable, match="'toy' is declared by plugins 'a' and 'b'"):
        bind_owner(plugins, "toy", env={})


def test_tracing_wraps_bound_hooks(capsys: pytest.CaptureFixture[str]) -> None:
    plugins = load_plugins(objects={"owner": Owner()}, env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={"EDGE_TRACE_HOOKS": "1"})
    binding.reserve("stage-ctx")
    err = capsys.readouterr().err
    assert "[edge-trace] edge_reserve@owner('stage-ctx')" in err and " ms" in err


class Hanging:
    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.release = threading.Event()

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="slow", kinds=["graph"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        self.release.wait(10)
        return [ProbeReport(backend="slow", available=True)]


def test_a_hanging_probe_times_out_without_hiding_the_others() -> None:
    from edge_core.probe import probe_all

    hanging = Hanging()

    class Quick:
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_backends(self) -> list[BackendInfo]:
            return [BackendInfo(name="quick", kinds=["graph"])]

        @hookimpl
        def edge_probe(self) -> list[ProbeReport]:
            return [ProbeReport(backend="quick", available=True)]

    plugins = load_plugins(objects={"hanging": hanging, "quick": Quick()},
                           env={"EDGE_PLUGINS": ""})
    try:
        result = probe_all(plugins, timeout_s=0.3)
    finally:
        hanging.release.set()
    rows = {row["backend"]: row for row in result["backends"]}
    assert rows["quick"]["available"] is True
    assert rows["slow"]["available"] is False
    assert "no answer within 0.3 s" in rows["slow"]["reason"]


class Injector:
    """A fault-injection plugin: wraps owner hooks of any backend."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl(wrapper=True)
    def edge_reserve(self, stage: Any) -> Any:
        self.seen.append(f"before {stage}")
        result = yield
        self.seen.append("after")
        return {**result, "machine:ram": 99}

    @hookimpl(wrapper=True)
    def edge_load(self, stage: Any) -> Any:
        try:
            return (yield)
        except RuntimeError as exc:
            return f"recovered from {exc}"


class FailingLoad(Owner):
    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        raise RuntimeError("boom")


def test_wrappers_from_other_plugins_wrap_owner_hooks() -> None:
    injector = Injector()
    plugins = load_plugins(objects={"owner": Owner(), "inject": injector},
                           env={"EDGE_PLUGINS": ""})
    binding = bind_owner(plugins, "toy", env={})
    assert binding.reserve("S") == {"machine:ram": 99}
    assert injector.seen == ["before S", "after"]
    plugins = load_plugins(objects={"owner": FailingLoad(), "inject": Injector()},
                           env={"EDGE_PLUGINS": ""})
    assert bind_owner(plugins, "toy", env={}).load("S") == "recovered from boom"


def test_without_wrappers_the_owner_exception_propagates() -> None:
    plugins = load_plugins(objects={"owner": FailingLoad()}, env={"EDGE_PLUGINS": ""})
    with pytest.raises(RuntimeError, match="boom"):
        bind_owner(plugins, "toy", env={}).load("S")
