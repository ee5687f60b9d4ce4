from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edge_core.errors import PluginError
from edge_core.plugins import check_contract, load_plugins

from .conftest import RunEdge
from .distributions import GOOD_PLUGIN, make_plugin_distribution


def _rows(stdout: str) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(stdout)["plugins"]}


def test_broken_and_future_plugins_are_reported_not_fatal(run_edge: RunEdge) -> None:
    result = run_edge("plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows["toy"]["error"] is None
    assert rows["toy"]["distribution"] == "edge-toy"
    assert rows["toy"]["version"] == "0.1.0"
    assert rows["toy"]["backends"] == []  # backends are read only with --backends
    assert set(rows["toy"]["hooks"]) == {"edge_backends", "edge_probe"}
    assert "import failed: ImportError: this plugin's runtime is missing" in rows["broken"]["error"]
    assert rows["broken"]["loaded"] is False
    assert "hook contract 2.0 is not supported" in rows["future"]["error"]
    assert rows["future"]["contract"] == "2.0"
    assert rows["future"]["hooks"] == []


def test_backends_flag_reads_each_plugins_backends(run_edge: RunEdge) -> None:
    result = run_edge("plugins", "--json", "--backends", env={"EDGE_PLUGINS": "toy,broken"})
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows["toy"]["backends"] == ["toy"]
    assert rows["broken"]["backends"] == []
    assert rows["broken"]["loaded"] is False


def test_strict_mode_makes_plugin_failures_fatal(run_edge: RunEdge) -> None:
    for extra in ((), ("--backends",)):
        result = run_edge("plugins", "--json", *extra, env={"EDGE_STRICT_PLUGINS": "1"})
        assert result.returncode == 3, extra
        body = json.loads(result.stdout)
        assert body["ok"] is False
        assert "broken" in body["error"] and "future" in body["error"]


def test_strict_mode_failure_of_a_plugin_command_honours_its_json(run_edge: RunEdge) -> None:
    """``edge serve --json``: the plugins fail before serve's own flags are parsed."""
    env = {"EDGE_STRICT_PLUGINS": "1", "EDGE_PLUGINS": "serve,broken"}
    result = run_edge("serve", "--json", env=env)
    assert result.returncode == 3, result.stderr
    body = json.loads(result.stdout)
    assert body == {"ok": False, "error": body["error"]}
    assert body["error"].startswith("plugins: 1 plugin(s) failed to load: broken: import "
                                    "failed: ImportError: this plugin's runtime is missing")
    builtin = run_edge("plugins", "--backends", "--json", env=env)  # the same document
    assert (builtin.returncode, json.loads(builtin.stdout)) == (3, body)
    assert result.stderr == builtin.stderr == ""
    text = run_edge("serve", env=env)  # without --json: the one line on stderr
    assert (text.returncode, text.stdout) == (3, "")
    assert text.stderr == f"edge: {body['error']}\n"


def test_allowlist_loads_only_named_plugins(run_edge: RunEdge) -> None:
    result = run_edge("plugins", "--json", env={"EDGE_PLUGINS": "toy,future"})
    assert result.returncode == 0
    assert set(_rows(result.stdout)) == {"toy", "future"}


def test_empty_allowlist_loads_no_plugin(run_edge: RunEdge) -> None:
    result = run_edge("plugins", "--json", env={"EDGE_PLUGINS": ""})
    assert result.returncode == 0
    assert _rows(result.stdout) == {}


def test_an_allowlisted_name_that_is_not_installed_is_listed_and_warned_about(
    run_edge: RunEdge,
) -> None:
    result = run_edge("plugins", "--json", env={"EDGE_PLUGINS": "toy,tyo"})
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows["toy"]["error"] is None
    assert rows["tyo"]["loaded"] is False
    assert rows["tyo"]["error"] == ("not installed: no installed distribution has an entry "
                                    "point 'tyo' in group 'edge'; did you mean 'toy'?")
    assert result.stderr.splitlines() == [
        f"edge: warning: plugin 'tyo' (named by EDGE_PLUGINS) did not load: {rows['tyo']['error']}"]
    text = run_edge("plugins", env={"EDGE_PLUGINS": "tyo"})
    assert "ERROR:    not installed" in text.stdout and "module:" not in text.stdout
    strict = run_edge("plugins", "--json", env={"EDGE_PLUGINS": "toy,tyo",
                                                "EDGE_STRICT_PLUGINS": "1"})
    assert strict.returncode == 3
    assert "1 plugin(s) failed to load: tyo: not installed" in json.loads(strict.stdout)["error"]


def test_a_plugin_nobody_named_is_listed_with_its_error_but_not_warned_about(
    run_edge: RunEdge,
) -> None:
    result = run_edge("plugins", "--json")
    assert result.returncode == 0
    assert _rows(result.stdout)["broken"]["error"]
    assert "warning" not in result.stderr
    named = run_edge("plugins", "--json", env={"EDGE_PLUGINS": "toy,broken"})
    assert "plugin 'broken' (named by EDGE_PLUGINS) did not load: import failed" in named.stderr


def test_an_allowlisted_local_module_or_object_is_not_reported_missing(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Registered:
        EDGE_CONTRACT = "1.0"

    monkeypatch.syspath_prepend(str(plugin_site))
    plugins = load_plugins(local_modules=["edge_toy_plugin"], objects={"held": Registered()},
                           env={"EDGE_PLUGINS": "edge_toy_plugin,held,gone"})
    assert {r.name: r.loaded for r in plugins.records} == {
        "gone": False, "edge_toy_plugin": True, "held": True}
    assert (plugins.record("gone").error or "").startswith("not installed: ")
    sys.modules.pop("edge_toy_plugin", None)


def test_human_output_names_each_plugin_and_its_error(run_edge: RunEdge) -> None:
    result = run_edge("plugins", env={"EDGE_PLUGINS": "toy,broken"})
    assert result.returncode == 0
    assert "toy  [edge-toy 0.1.0]" in result.stdout
    assert "ERROR:    import failed" in result.stdout


def test_probe_isolates_a_crashing_plugin(run_edge: RunEdge) -> None:
    result = run_edge("probe", "--json", env={"EDGE_PLUGINS": "toy,crashy"})
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    rows = {row["backend"]: row for row in body["backends"]}
    assert rows["toy"]["available"] is True
    assert rows["crashy"]["available"] is False
    assert "driver exploded" in rows["crashy"]["reason"]
    assert {"plugin": "crashy", "error": "RuntimeError: driver exploded",
            "named_by": "EDGE_PLUGINS"} in body["plugin_errors"]


def test_probe_json_lists_plugin_errors_as_run_does_with_who_named_each(
    run_edge: RunEdge, plugin_site: Path,
) -> None:
    # Before, a plugin that did not load was {"plugin", "error"} here, and one that
    # imported but whose backends could not be read (a duplicate) was not listed at all,
    # while edge run/plan/profile --json list both as {"plugin", "error", "named_by"}.
    make_plugin_distribution(plugin_site, "edge-toy-again", "again", "edge_toy_again_plugin",
                             GOOD_PLUGIN)  # declares the backend "toy" a second time:
    # neither "toy" nor "again" serves it then, and both list the clash
    for named, named_by, kinds in (
            ("toy,crashy,broken,again,gone", "EDGE_PLUGINS",
             ["backend", "backend", "import failed", "not installed"]),
            (None, None, ["EDGE_CONTRACT", "backend", "backend", "import failed"])):  # + future
        env = {"EDGE_PLUGINS": named} if named else {}
        result = run_edge("probe", "--json", env=env)
        assert result.returncode == 0, result.stderr
        listed = json.loads(result.stdout)["plugin_errors"]
        plugins = run_edge("plugins", "--backends", "--json", env=env)  # as edge run reads
        not_loaded = [row for row in json.loads(plugins.stdout)["plugins"] if row["error"]]
        assert listed[0] == {"plugin": "crashy", "error": "RuntimeError: driver exploded",
                             "named_by": named_by}  # its probe failed
        assert listed[1:] == [{"plugin": row["name"], "error": row["error"],
                               "named_by": named_by} for row in not_loaded]
        assert sorted(row["error"].split(":")[0] for row in listed[1:]) == kinds


def test_probe_of_a_named_unavailable_backend_exits_1(run_edge: RunEdge) -> None:
    result = run_edge("probe", "--json", "--backend", "crashy",
                      env={"EDGE_PLUGINS": "crashy"})
    assert result.returncode == 1


def test_local_plugin_module_named_in_config_is_loaded(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(plugin_site))
    plugins = load_plugins(local_modules=["edge_toy_plugin"], env={"EDGE_PLUGINS": ""})
    record = plugins.record("edge_toy_plugin")
    assert record.source == "config"
    assert record.backends == ("toy",)
    sys.modules.pop("edge_toy_plugin", None)


def test_local_plugin_that_fails_to_import_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = load_plugins(local_modules=["no_such_edge_plugin"], env={"EDGE_PLUGINS": ""})
    assert "ModuleNotFoundError" in (plugins.record("no_such_edge_plugin").error or "")
    with pytest.raises(PluginError, match="no_such_edge_plugin"):
        load_plugins(local_modules=["no_such_edge_plugin"], env={"EDGE_PLUGINS": ""}, strict=True)


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        ("1.0", None),
        ("2.0", "not supported"),
        ("1.9", "not supported"),
        ("one", "not a 'major.minor'"),
        (None, "not declared"),
        (1.0, "not declared"),
    ],
)
def test_contract_versions(declared: object, problem: str | None) -> None:
    answer = check_contract(declared)
    if problem is None:
        assert answer is None
    else:
        assert answer is not None and problem in answer


def test_a_hook_with_arguments_outside_its_spec_is_refused(tmp_path: Path) -> None:
    from .distributions import make_plugin_distribution

    make_plugin_distribution(tmp_path, "edge-bad-args", "badargs", "edge_badargs_plugin", """
        from edge_core import hookimpl
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_probe(verbose):
            return []
    """)
    make_plugin_distribution(tmp_path, "edge-bad-hook", "badhook", "edge_badhook_plugin", """
        from edge_core import hookimpl
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_teleport():
            return []
    """)
    sys.path.insert(0, str(tmp_path))
    try:
        plugins = load_plugins(env={"EDGE_PLUGINS": "badargs,badhook"})
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("edge_badargs_plugin", "edge_badhook_plugin"):
            sys.modules.pop(name, None)
    assert "arguments ['verbose'] are not in the specification" in (
        plugins.record("badargs").error or "")
    assert "'edge_teleport': no such hook" in (plugins.record("badhook").error or "")
    assert plugins.manager.get_plugin("badargs") is None


def test_a_plugin_can_add_a_subcommand(tmp_path: Path, run_edge: RunEdge,
                                       plugin_site: Path) -> None:
    from .distributions import make_plugin_distribution

    make_plugin_distribution(plugin_site, "edge-hello", "hello", "edge_hello_plugin", """
        from edge_core import hookimpl
        EDGE_CONTRACT = "1.0"

        def _run(args):
            print(f"hello {args.who}")
            return 0

        @hookimpl
        def edge_register_commands(subparsers):
            parser = subparsers.add_parser("hello", help="greet")
            parser.add_argument("who")
            parser.set_defaults(func=_run)
    """)
    result = run_edge("hello", "world", env={"EDGE_PLUGINS": "hello"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello world"
    unknown = run_edge("nosuchcommand", env={"EDGE_PLUGINS": "hello"})
    assert unknown.returncode == 2


def test_one_pass_over_the_path_finds_each_group_as_importlib_metadata_does(
        plugin_site: Path, tmp_path: Path) -> None:
    import importlib.metadata
    import zipfile

    from edge_core.discovery import ENTRY_POINT_GROUP, TEST_ENTRY_POINT_GROUP, scan_groups

    zipped = tmp_path / "zipped.zip"  # a path entry that is not a folder
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("edge_zed-1.0.dist-info/METADATA",
                         "Metadata-Version: 2.1\nName: edge-zed\nVersion: 1.0\n")
        archive.writestr("edge_zed-1.0.dist-info/entry_points.txt",
                         "[edge]\nzed = edge_zed\n[edge.testing]\nzed-test = edge_zed:T\n")
    path = [str(plugin_site), str(zipped)]
    groups = (ENTRY_POINT_GROUP, TEST_ENTRY_POINT_GROUP)
    found = scan_groups(groups, path)
    for group in groups:
        expected = sorted((ep.name, ep.value)
                          for dist in importlib.metadata.distributions(path=path)
                          for ep in dist.entry_points if ep.group == group)
        assert sorted((row.name, row.value) for row in found[group]) == expected
    assert {row.name for row in found[ENTRY_POINT_GROUP]} == {
        "toy", "broken", "future", "crashy", "zed"}
    assert [(row.name, row.distribution) for row in found[TEST_ENTRY_POINT_GROUP]] == [
        ("zed-test", "edge-zed")]


def test_strict_plugins_spares_the_commands_that_load_none_and_ends_the_others(
    run_edge: RunEdge, plugin_site: Path, tmp_path: Path,
) -> None:
    """docs/cli.md: exit 3 under EDGE_STRICT_PLUGINS=1 in every command that loads plugins.

    ``edge manifest``, ``qualify``, ``matrix`` and ``cleanup`` load none (nothing they read
    depends on one): a broken plugin is not imported there, not warned about and no exit
    3 (their exit is what it is without the variable); every other command imports it
    and ends with exit 3.
    """
    from edge_core.cli import BUILTIN_COMMANDS, PLUGIN_FREE_COMMANDS

    marker = tmp_path / "imported"
    make_plugin_distribution(plugin_site, "edge-noisy", "noisy", "edge_noisy_plugin",
                             f"open({str(marker)!r}, 'a').write('imported\\n')\n"
                             "raise ImportError('broken on purpose')\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "weights.bin").write_bytes(b"weights")
    (tmp_path / "p.toml").write_text('name = "p"\n[[stages]]\nid = "a"\n'
                                     '[stages.backend]\nname = "toy"\n')
    free = {"manifest": [["manifest", "create", str(bundle), "--graph", "weights.bin",
                          "--force"],
                         ["manifest", "verify", str(bundle)]],
            "qualify": [["qualify", "--profile", str(tmp_path / "none.json")]],
            "matrix": [["matrix", str(tmp_path / "no-records")]],
            "cleanup": [["cleanup", "--dry-run"]]}
    assert sorted(free) == sorted(PLUGIN_FREE_COMMANDS)
    named = {"EDGE_PLUGINS": "toy,noisy"}
    strict = {**named, "EDGE_STRICT_PLUGINS": "1"}
    for argvs in free.values():
        for argv in argvs:
            for as_json in ((), ("--json",)):
                lenient = run_edge(*argv, *as_json, env=named)
                result = run_edge(*argv, *as_json, env=strict)
                assert result.returncode == lenient.returncode != 3, (argv, result.stderr)
                assert "noisy" not in result.stderr + result.stdout, argv
                assert not marker.exists(), argv
    others = {"run": ["run", str(tmp_path / "p.toml")],
              "plan": ["plan", str(tmp_path / "p.toml"), "--probe-only"],
              "probe": ["probe", "--fresh"], "plugins": ["plugins"],
              "profile": ["profile", str(tmp_path / "p.toml"), "--out",
                          str(tmp_path / "p.json")],
              "conformance": ["conformance", "toy"]}
    assert sorted([*free, *others]) == sorted(BUILTIN_COMMANDS)
    for argv in [*others.values(), []]:  # and `edge` alone: its help lists plugin commands
        result = run_edge(*argv, env=strict)
        assert result.returncode == 3, (argv, result.stderr)
        assert "noisy: import failed: ImportError: broken on purpose" in result.stderr, argv
        assert marker.read_text() == "imported\n", argv
        marker.unlink()


DICT_BACKENDS_PLUGIN = """
    from edge_core import hookimpl
    from edge_core.backend import BackendInfo, ProbeReport

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends():
        return {"dicty": BackendInfo(name="dicty", kinds=["graph"])}

    @hookimpl
    def edge_probe():
        return [ProbeReport(backend="dicty", available=True)]
"""


def test_edge_probe_reports_no_backend_of_a_plugin_whose_backends_answer_is_refused(
    run_edge: RunEdge, plugin_site: Path,
) -> None:
    """edge_backends answering a dict: the plugin is named with the error, its row is not
    available (it was, though no stage could bind to it) and ``--backend`` exits 1."""
    make_plugin_distribution(plugin_site, "edge-dicty", "dicty", "edge_dicty_plugin",
                             DICT_BACKENDS_PLUGIN)
    env = {"EDGE_PLUGINS": "toy,dicty"}
    result = run_edge("probe", "--fresh", "--json", env=env)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    rows = {row["backend"]: row for row in body["backends"]}
    assert rows["toy"]["available"] is True
    error = "edge_backends returned dict {'dicty': BackendInfo(name='dicty', "
    assert rows["dicty"]["available"] is False
    assert rows["dicty"]["reason"].startswith(f"plugin 'dicty' does not serve it: {error}")
    (listed,) = body["plugin_errors"]
    assert listed["plugin"] == "dicty" and listed["error"].startswith(error)
    named = run_edge("probe", "--fresh", "--backend", "dicty", env=env)
    assert named.returncode == 1
    assert "dicty  [dicty]  unavailable: plugin 'dicty' does not serve it: " in named.stdout
    strict = run_edge("probe", "--fresh", "--json", env={**env, "EDGE_STRICT_PLUGINS": "1"})
    assert strict.returncode == 3
    assert "dicty: edge_backends returned dict" in json.loads(strict.stdout)["error"]


TARGETED_PLUGIN = """
    from edge_core import hookimpl
    from edge_core.backend import BackendInfo, ProbeReport

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends():
        return [BackendInfo(name="npu", kinds=["graph"],
                            providers=["NpuExecutionProvider", "CPUExecutionProvider"]),
                BackendInfo(name="npu-quiet", kinds=["graph"])]

    @hookimpl
    def edge_probe():
        return [ProbeReport(backend="npu", available=True)]
"""


def test_probe_and_plugins_name_the_placement_targets_a_backend_declares(
    run_edge: RunEdge, plugin_site: Path,
) -> None:
    """The placement.target values a stage may name are listed, in JSON and text, so that a
    user need not misspell one to learn them from the file check."""
    make_plugin_distribution(plugin_site, "edge-npu", "npu", "edge_npu_plugin",
                             TARGETED_PLUGIN)
    env = {"EDGE_PLUGINS": "toy,npu"}
    probed = run_edge("probe", "--fresh", "--json", env=env)
    assert probed.returncode == 0, probed.stderr
    rows = {row["backend"]: row for row in json.loads(probed.stdout)["backends"]}
    assert rows["npu"]["targets"] == ["NpuExecutionProvider", "CPUExecutionProvider"]
    assert rows["npu-quiet"]["targets"] == []  # no report: unavailable, still listed
    assert rows["npu-quiet"]["available"] is False
    assert rows["toy"]["targets"] == []
    text = run_edge("probe", "--fresh", env=env)
    assert ("npu  [npu]  available\n"
            "  placement targets: NpuExecutionProvider, CPUExecutionProvider\n") in text.stdout
    assert ("toy  [toy]  available\n  placement targets: none declared (a placement.target "
            "is not checked before load)\n") in text.stdout
    kept = run_edge("probe", "--json", env=env)  # the kept answer keeps them
    assert {row["backend"]: row["targets"] for row in json.loads(kept.stdout)["backends"]} == {
        name: row["targets"] for name, row in rows.items()}
    listed = run_edge("plugins", "--backends", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    plugin_rows = _rows(listed.stdout)
    assert plugin_rows["npu"]["targets"] == {
        "npu": ["NpuExecutionProvider", "CPUExecutionProvider"], "npu-quiet": []}
    assert plugin_rows["toy"]["targets"] == {"toy": []}
    assert _rows(run_edge("plugins", "--json", env=env).stdout)["npu"]["targets"] == {}
    text = run_edge("plugins", "--backends", env=env)
    assert ("  backends: npu, npu-quiet\n"
            "  npu: placement targets: NpuExecutionProvider, CPUExecutionProvider\n"
            "  npu-quiet: placement targets: none declared (a placement.target is not checked "
            "before load)\n") in text.stdout
