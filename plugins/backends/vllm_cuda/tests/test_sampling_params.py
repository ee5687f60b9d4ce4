"""The sampling features a request may ask for, the context check, and the faults declared.

No engine here: what vLLM does with them is tested against the real CPU engine through
``edge serve`` (plugins/apps/serve/tests/test_openai_edges.py).
"""

from __future__ import annotations

import pytest

from edge_contracts.request_faults import RequestFault, fault_of
from edge_vllm_cuda.sampling import (
    DEFAULT_MAX_TOKENS,
    MAX_CHOICES,
    ContextLengthExceeded,
    GenerateParamsInvalid,
    check_context,
    parse_generate_params,
)


def test_the_vllm_sampling_features_reach_the_engine_arguments() -> None:
    params = parse_generate_params({
        "prompts": ["edge stage", [1, 2, 3]], "n": 2, "temperature": 0.7, "seed": 3,
        "logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -0.25,
        "repetition_penalty": 1.1, "min_p": 0.05, "max_tokens": 5, "json_object": True})
    assert params.engine_prompts() == ("edge stage", (1, 2, 3))
    assert params.choices == 4 and params.prompt_field == "prompts"
    kwargs = params.sampling_kwargs()
    assert {k: kwargs[k] for k in ("n", "logprobs", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty", "min_p", "max_tokens")} == {
        "n": 2, "logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -0.25,
        "repetition_penalty": 1.1, "min_p": 0.05, "max_tokens": 5}
    assert params.json_object and params.json_schema is None
    assert parse_generate_params({"prompt": "x"}).sampling_kwargs()["max_tokens"] == \
        DEFAULT_MAX_TOKENS
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_generate_params({"prompt": "x", "json_schema": schema}).json_schema == schema


@pytest.mark.parametrize(("params", "field", "code"), [
    ({"prompt": "x", "n": 2, "temperature": 0.0}, "n", "invalid_value"),
    ({"prompt": "x", "n": 0}, "n", "invalid_value"),
    ({"prompts": ["a"] * 3, "n": MAX_CHOICES, "temperature": 1.0}, "n", "invalid_value"),
    ({"prompt": "x", "logprobs": 21}, "logprobs", "invalid_value"),
    ({"prompt": "x", "logprobs": True}, "logprobs", "invalid_value"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
    ({"prompt": "x", "frequency_penalty": float("inf")}, "frequency_penalty", "invalid_value"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "invalid_value"),
    ({"prompt": "x", "json_object": True, "json_schema": {}}, "json_schema", "invalid_value"),
    ({"prompt": "x", "json_object": "yes"}, "json_object", "invalid_value"),
    ({"prompt": "x", "json_schema": ["not", "a", "schema"]}, "json_schema", "invalid_value"),
    ({"prompts": []}, "prompts", "invalid_value"),
    ({"prompts": ["a", ""]}, "prompts[1]", "invalid_value"),
    ({"prompts": ["a", [1, -1]]}, "prompts[1]", "invalid_value"),
    ({"prompt": "x", "best_of": 2}, "best_of", "unsupported_parameter"),
])
def test_each_refusal_names_its_field_and_declares_its_code(
        params: dict[str, object], field: str, code: str) -> None:
    with pytest.raises(GenerateParamsInvalid) as caught:
        parse_generate_params(params)
    assert caught.value.field == field
    assert fault_of(caught.value) == RequestFault(code, field)


def test_the_context_check_names_the_limit_and_by_how_much() -> None:
    limit = 256
    asked = parse_generate_params({"prompt": "x", "max_tokens": 100})
    assert check_context(156, asked, limit) == 100
    with pytest.raises(ContextLengthExceeded) as caught:
        check_context(157, asked, limit)
    assert caught.value.field == "max_tokens"
    assert "257 in all exceeds the stage's context of 256 tokens by 1" in str(caught.value)
    assert "at most 99 can be generated" in str(caught.value)
    assert fault_of(caught.value) == RequestFault("context_length_exceeded", "max_tokens")
    with pytest.raises(ContextLengthExceeded) as caught:
        check_context(300, asked, limit, "prompts[1]")
    assert caught.value.field == "prompts[1]"
    assert "45 too many to generate even one token" in str(caught.value)
    # Without max_tokens the default is cut to what the context leaves, as vLLM's server does.
    default = parse_generate_params({"messages": [{"role": "user", "content": "x"}]})
    assert check_context(250, default, limit) == 6
    assert check_context(10, default, limit) == DEFAULT_MAX_TOKENS
    with pytest.raises(ContextLengthExceeded) as caught:
        check_context(256, default, limit)
    assert caught.value.field == "messages"
