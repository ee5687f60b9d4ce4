"""The hook reference is generated and current, and every hook is documented and tested.

:data:`HOOK_TESTS` names, for each hook, tests that exercise a real implementation of it;
the meta-tests check that the mapping covers every hook and that each named test exists.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from edge_core import hookspecs
from edge_core.testing.hookref import render

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "docs" / "hooks.md"
CONFORMANCE = "core/tests/conformance"
RUNTIME = "core/tests/runtime"

HOOK_TESTS: dict[str, tuple[str, ...]] = {
    "edge_backends": (
        "core/tests/plugins/test_binding.py::"
        "test_a_backend_declared_by_two_plugins_is_served_by_neither",
        "core/tests/plugins/test_loading.py::test_backends_flag_reads_each_plugins_backends",
        "core/tests/plugins/test_binding.py::"
        "test_a_backends_answer_that_is_not_a_list_of_backend_info_is_refused_naming_the_plugin",
    ),
    "edge_probe": (
        "core/tests/plugins/test_binding.py::"
        "test_a_hanging_probe_times_out_without_hiding_the_others",
        "core/tests/plugins/test_loading.py::test_probe_isolates_a_crashing_plugin",
        f"{RUNTIME}/test_open_and_unwind.py::"
        "test_an_unavailable_backend_is_refused_with_its_probe_reason",
        f"{CONFORMANCE}/test_kit_verdicts.py::test_a_probe_that_imports_a_heavy_runtime_fails",
    ),
    "edge_config_defaults": (
        f"{CONFORMANCE}/test_config_hooks.py::"
        "test_plugin_defaults_apply_under_the_users_options",
        "core/tests/plugins/test_binding.py::test_optional_owner_hooks_have_safe_defaults",
    ),
    "edge_validate_stage": (
        f"{RUNTIME}/test_open_and_unwind.py::test_invalid_backend_options_name_the_path",
        "core/tests/config/test_pipeline_files.py::"
        "test_a_plugin_can_structure_its_options_with_the_same_strict_converter",
    ),
    "edge_reserve": (
        f"{RUNTIME}/test_open_and_unwind.py::"
        "test_joint_admission_refused_leaves_nothing_charged_and_starts_nothing",
        f"{RUNTIME}/test_open_and_unwind.py::"
        "test_observed_memory_above_the_demand_is_refused_with_both_numbers",
    ),
    "edge_load": (
        f"{RUNTIME}/test_open_and_unwind.py::test_a_failing_second_stage_unwinds_the_first",
        "core/tests/plugins/test_binding.py::"
        "test_a_load_that_fails_after_starting_a_worker_retires_it_there_and_then",
        f"{RUNTIME}/test_open_and_unwind.py::"
        "test_a_two_stage_chain_runs_and_closes_with_nothing_charged",
    ),
    "edge_warmup_placement": (
        f"{RUNTIME}/test_open_and_unwind.py::test_a_placement_failure_releases_the_load",
        f"{RUNTIME}/test_open_and_unwind.py::test_wrong_warmup_numerics_refuse_the_stage",
    ),
    "edge_call": (
        f"{RUNTIME}/test_open_and_unwind.py::"
        "test_a_two_stage_chain_runs_and_closes_with_nothing_charged",
        f"{RUNTIME}/test_flow_and_cancel.py::test_no_output_of_a_fenced_epoch_is_delivered",
    ),
    "edge_cancel": (
        f"{RUNTIME}/test_flow_and_cancel.py::"
        "test_cancelling_a_preemptible_call_stops_it_in_place_and_keeps_the_worker",
        f"{RUNTIME}/test_flow_and_cancel.py::"
        "test_cancelling_a_running_non_preemptible_call_retires_its_worker",
        f"{CONFORMANCE}/test_kit_verdicts.py::"
        "test_wrong_outputs_and_an_untrue_preemptible_claim_fail_their_checks",
    ),
    "edge_retire": (
        f"{RUNTIME}/test_flow_and_cancel.py::"
        "test_unverified_retirement_keeps_the_reservation_quarantined",
        f"{CONFORMANCE}/test_installed_backends.py::"
        "test_installed_backend_conforms_or_skips_every_check_with_its_reason",
    ),
    "edge_conformance_stage": (
        f"{CONFORMANCE}/test_kit_verdicts.py::"
        "test_a_raising_conformance_hook_fails_the_stage_checks",
        f"{CONFORMANCE}/test_installed_backends.py::"
        "test_installed_backend_conforms_or_skips_every_check_with_its_reason",
    ),
    "edge_register_commands": (
        "core/tests/plugins/test_loading.py::test_a_plugin_can_add_a_subcommand",
    ),
}


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_the_committed_reference_is_what_the_hookspecs_generate() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/hooks.md is out of date: run python -m edge_core.testing.hookref docs/hooks.md")


def test_the_generator_check_mode_agrees(tmp_path: Path) -> None:
    stale = tmp_path / "hooks.md"
    stale.write_text("# old\n", encoding="utf-8")
    command = [sys.executable, "-m", "edge_core.testing.hookref", "--check"]
    assert subprocess.run([*command, str(stale)], capture_output=True, check=False).returncode == 1
    assert subprocess.run([*command, str(REFERENCE)], check=False).returncode == 0


@pytest.mark.parametrize("name", hookspecs.HOOK_NAMES)
def test_every_hook_has_a_documented_section(name: str) -> None:
    text = render()
    section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
    assert f"def {name}(" in section
    assert len(section.strip().splitlines()) >= 6  # signature block plus prose


def test_every_hook_is_mapped_to_tests() -> None:
    assert set(HOOK_TESTS) == set(hookspecs.HOOK_NAMES)
    assert all(HOOK_TESTS[name] for name in hookspecs.HOOK_NAMES)


@pytest.mark.parametrize("test_id", sorted({t for ids in HOOK_TESTS.values() for t in ids}))
def test_every_mapped_test_exists(test_id: str) -> None:
    path, _, function = test_id.partition("::")
    assert (ROOT / path).is_file(), path
    assert function in _defined_tests(ROOT / path), test_id
