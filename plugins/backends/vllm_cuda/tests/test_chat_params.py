"""A chat (``messages``) as a generate request's prompt: checked before anything is sent.

The worker renders it with the model's own chat template (tested against the real engine
in plugins/apps/serve/tests/test_serve_vllm.py); here only the checks, no engine.
"""

from __future__ import annotations

import pytest

from edge_vllm_cuda.sampling import GenerateParamsInvalid, parse_generate_params

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_messages_are_a_prompt_form_of_their_own() -> None:
    params = parse_generate_params({"messages": CHAT, "max_tokens": 4})
    assert params.messages == (("system", "Be brief."), ("user", "hi"))
    assert params.prompt is None and params.prompt_token_ids is None
    with pytest.raises(ValueError, match="rendered by the worker"):
        params.engine_prompt()


@pytest.mark.parametrize(("params", "field"), [
    ({"messages": CHAT, "prompt": "x"}, "params.prompt: give exactly one of prompt, "
                                        "prompt_token_ids, prompts and messages"),
    ({"messages": []}, "params.messages: must be a non-empty list"),
    ({"messages": "hi"}, "params.messages: must be a non-empty list"),
    ({"messages": [{"role": "user"}]}, r"params.messages\[0\]: must be an object"),
    ({"messages": [{"role": "", "content": "x"}]}, r"params.messages\[0\].role"),
    ({"messages": [{"role": "user", "content": 3}]}, r"params.messages\[0\].content"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]},
     r"params.messages\[0\]: must be an object"),
])
def test_malformed_messages_are_refused_naming_the_field(params: dict[str, object],
                                                         field: str) -> None:
    with pytest.raises(GenerateParamsInvalid, match=field):
        parse_generate_params(params)
