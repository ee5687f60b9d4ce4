"""What edge profile and edge qualify read: targets, workload files, golden sets.

Every malformed input is refused with the field (and line) and the value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.golden import load_golden
from edge_core.evidence.quality_checks import max_abs_error, reference_tokens
from edge_core.evidence.targets import (
    Target,
    evaluate,
    load_targets,
    measured_metrics,
    parse_target,
)
from edge_core.evidence.workload_file import classes_from_params, read_workload


def test_targets_parse_with_an_optional_level() -> None:
    assert parse_target("ttft_p95_ms <= 800") == Target("ttft_p95_ms", "<=", 800.0, None,
                                                        "ttft_p95_ms <= 800")
    assert parse_target("decode_tokens_per_s@c2>=20.5").level == 2
    assert parse_target("rtf_max < 1").met_by(0.5)
    assert not parse_target("rtf_max < 1").met_by(1.0)


@pytest.mark.parametrize(("text", "message"), [
    ("ttft_p59_ms <= 800", "unknown metric 'ttft_p59_ms'"),
    ("ttft_p95_ms ~ 800", "not of the form"),
    ("ttft_p95_ms <= fast", "the bound is not a number"),
    ("ttft_p95_ms <= inf", "the bound must be finite"),
    ("ttft_p95_ms@c0 <= 1", "a concurrency level is at least 1"),
    (800, "must be a string"),
])
def test_bad_targets_are_refused_naming_them(text: Any, message: str) -> None:
    with pytest.raises(RecordInvalid, match=message):
        parse_target(text, "targets[0]")


def test_targets_files_in_toml_and_json(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text('targets = ["ttft_p95_ms <= 800", "open_s < 30"]\n')
    assert [t.metric for t in load_targets(tmp_path / "t.toml")] == ["ttft_p95_ms", "open_s"]
    (tmp_path / "t.json").write_text(json.dumps({"targets": ["latency_p50_ms <= 5"]}))
    assert load_targets(tmp_path / "t.json")[0].bound == 5.0
    (tmp_path / "none.toml").write_text("goals = []\n")
    with pytest.raises(RecordInvalid, match="the file needs a 'targets' list"):
        load_targets(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text('targets = ["ttft <= 1"]\n')
    with pytest.raises(RecordInvalid, match=r"bad.toml: targets\[0\]: unknown metric"):
        load_targets(tmp_path / "bad.toml")
    with pytest.raises(RecordInvalid, match="cannot read the targets file") as missing:
        load_targets(tmp_path / "missing.toml")
    # a problem without a value reads "field: reason", with no ": None" after it
    assert str(missing.value).endswith("(No such file or directory)"), str(missing.value)
    (tmp_path / "null.json").write_text(json.dumps({"targets": [None]}))
    with pytest.raises(RecordInvalid) as null:  # a value that is null is shown as such
        load_targets(tmp_path / "null.json")
    assert str(null.value).endswith("must be a string 'METRIC OP NUMBER': None"), str(null.value)


def test_a_target_applies_at_every_measured_scope_or_at_its_level() -> None:
    performance = {"latency": {"a@c1": {"n": 20, "p95_ms": 10.0},
                               "a@c2": {"n": 20, "p95_ms": 30.0},
                               "a@c4": {"status": "skipped", "reason": "admission"}}}
    metrics = measured_metrics(performance)
    assert metrics["latency_p95_ms"] == {"a@c1": 10.0, "a@c2": 30.0}
    rows = evaluate([parse_target("latency_p95_ms <= 20"),
                     parse_target("latency_p95_ms@c1 <= 20"),
                     parse_target("ttft_p95_ms <= 1")], metrics)
    assert [r["outcome"] for r in rows] == ["failed", "met", "unmeasured"]
    assert rows[0]["missed"] == ["a@c2"]


def _workload(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line)
                              for line in lines) + "\n")
    return path


def test_a_workload_file_groups_requests_by_class_in_order(tmp_path: Path) -> None:
    path = _workload(tmp_path, {"class": "short", "prompt": "hi", "params": {"max_tokens": 4}},
                     "", {"class": "chat", "messages": [{"role": "user", "content": "x"}]},
                     {"class": "short", "prompt_token_ids": [1, 2]},
                     {"class": "from-pages", "params": {"max_tokens": 8}})
    classes = read_workload(path)
    assert [c.name for c in classes] == ["short", "chat", "from-pages"]
    assert classes[0].requests == ({"max_tokens": 4, "prompt": "hi"},
                                   {"prompt_token_ids": [1, 2]})
    assert classes[1].requests[0]["messages"][0]["role"] == "user"
    assert classes_from_params({"prompt": "x"})[0].requests == ({"prompt": "x"},)


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "workload:1: not a JSON object"),
    ([1, 2], "workload:1: must be a JSON object"),
    ({"prompt": "x"}, "workload:1.class: must be a non-empty printable string"),
    ({"class": "a", "prompt": "x", "messages": []}, "give one of prompt, messages"),
    ({"class": "a"}, "a request needs a prompt"),
    ({"class": "a", "prompt": 3}, "workload:1.prompt: must be a string"),
    ({"class": "a", "messages": [{"role": "user"}]}, "workload:1.messages: must be a"),
    ({"class": "a", "prompt_token_ids": ["1"]}, "prompt_token_ids: must be a non-empty"),
    ({"class": "a", "prompt": "x", "temperature": 0}, "workload:1.temperature: unknown key"),
    ({"class": "a", "params": []}, "workload:1.params: must be an object"),
])
def test_bad_workload_lines_are_refused_with_their_line(tmp_path: Path, line: object,
                                                        message: str) -> None:
    with pytest.raises(RecordInvalid, match=message.replace("[", r"\[")):
        read_workload(_workload(tmp_path, line))


def test_an_empty_or_missing_workload_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(RecordInvalid, match="the file holds no request"):
        read_workload(tmp_path / "empty.jsonl")
    with pytest.raises(RecordInvalid, match="--workload: cannot read"):
        read_workload(tmp_path / "missing.jsonl")


def _golden(tmp_path: Path, **changes: Any) -> Path:
    (tmp_path / "page.png").write_bytes(b"not read here")
    data = {"schema": "edge.golden/1", "passes": ["cer <= 0.02"],
            "items": [{"name": "p", "input": "page.png", "truth": ["a line"]}], **changes}
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(data))
    return path


def test_a_golden_set_resolves_its_files_beside_it(tmp_path: Path) -> None:
    golden = load_golden(_golden(tmp_path))
    assert golden.items[0].source == (tmp_path / "page.png").resolve()
    assert golden.passes == ("cer <= 0.02",)


@pytest.mark.parametrize(("changes", "message"), [
    ({"schema": "x"}, "schema: must be 'edge.golden/1'"),
    ({"items": []}, "items: must be a non-empty list"),
    ({"passes": []}, "passes: must list the pass criteria"),
    ({"items": [{"input": "page.png", "truth": []}]}, r"items\[0\].name: must be"),
    ({"items": [{"name": "p", "input": "page.png"}]}, r"items\[0\].truth: required"),
    ({"items": [{"name": "p", "truth": 1}]}, "needs an 'input'"),
    ({"items": [{"name": "p", "input": "gone.png", "truth": 1}]}, "input: no such file"),
    ({"items": [{"name": "p", "params": [], "truth": 1}]}, "params: must be an object"),
    ({"items": [{"name": "p", "params": {}, "truth": 1, "extra": 1}]}, "extra: unknown key"),
])
def test_bad_golden_sets_are_refused_naming_the_field(tmp_path: Path, changes: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(RecordInvalid, match=message):
        load_golden(_golden(tmp_path, **changes))


LATIN_1 = {  # each file as an editor saving latin-1 would write it: 'é' is the one byte 0xe9
    "t.toml": 'targets = ["open_s < 30"]  # é\n',
    "w.jsonl": '{"class": "a", "prompt": "café"}\n',
    "golden.json": '{"schema": "edge.golden/1", "description": "café"}',
}


@pytest.mark.parametrize(("name", "read", "field"), [
    ("t.toml", load_targets, "{file}: "),
    ("w.jsonl", read_workload, "--workload: "),
    ("golden.json", load_golden, "golden {file}: "),
])
def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path, name: str,
                                                      read: Any, field: str) -> None:
    file = tmp_path / name
    text = LATIN_1[name]
    file.write_bytes(text.encode("latin-1"))
    with pytest.raises(RecordInvalid) as refused:
        read(file)
    message = str(refused.value)
    assert message.startswith(field.format(file=file)), message
    assert f"not valid UTF-8 (byte {text.index('é')}: invalid continuation byte)" in message
    assert str(file) in message, message


def test_the_built_in_quality_checks() -> None:
    tokens = reference_tokens([({"token_ids": [1, 2, 3]}, [1, 2, 3]),
                               ({"token_ids": [1, 9]}, {"token_ids": [1, 2, 3]})])
    assert tokens["exact_match"] == 0.5
    assert tokens["token_agreement"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="needs a list of token ids"):
        reference_tokens([({"text": "no ids"}, [1])])
    errors = max_abs_error([({"y": [[1.0, 2.0]]}, {"y": [[1.0, 2.5]]})])
    assert errors["max_abs_error"] == 0.5
    with pytest.raises(ValueError, match="shape"):
        max_abs_error([({"y": [1.0]}, {"y": [[1.0]]})])
