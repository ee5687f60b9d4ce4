"""A generate pipeline on the real vLLM CPU engine behind ``edge serve``, through ``openai``.

The tiny Llama of the vllm-cuda tests (random weights, a locally trained tokenizer with a
chat template; nothing is downloaded) runs in the cached vLLM CPU environment. The
official OpenAI client asks for a completion, a streamed chat completion, and closes a
stream after 3 tokens: that request alone is cancelled and aborted inside vLLM (the engine
holds no request afterwards) while another stream runs on to its end.

The same server serves ``page-chat``: the OCR stages, then the tiny Llama. A chat whose
user message carries a rendered page as an ``image_url`` part (a ``data:`` URL) has the
image read by the pipeline's ``prepare``, its text handed to the transforms as
``carry:messages``, and the transform ``page_chat`` builds the chat the worker receives:
the caller's messages, then the page's recognised text (checked by the sha256 the worker
reports). What cannot be mapped is refused with 400 naming the field.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from generate_server import API_KEY, SharedServer, engine_unfinished_after_abort
from prometheus_client.parser import text_string_to_metric_families
from serving import Served

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = {"temperature": 0.0}
CHAT = [{"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "edge stage token worker"}]

RENDER = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
text = tokenizer.apply_chat_template(json.loads(sys.argv[2]), tokenize=False,
                                     add_generation_prompt=True)
print(json.dumps(tokenizer.encode(text, add_special_tokens=False)))
"""


PAGE_TEXT = "Served over HTTP today\nTotal 12.75 for 3 pages"  # rendered in conftest


@pytest.fixture(scope="module")
def server(generate_server: SharedServer) -> Served:
    """The shared server (:mod:`generate_server`): ``ocr``, ``tiny`` and ``page-chat``."""
    return generate_server.get()


@pytest.fixture(scope="module")
def model(generate_server: SharedServer) -> tuple[Path, Path]:
    """The vLLM environment's interpreter and the tiny model's directory."""
    return generate_server.python, generate_server.model


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=120) as made:
        yield made


def _outcomes(server: Served) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"},
                     timeout=30).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "edge_requests_total" and sample.labels["pipeline"] == "tiny":
                key = f"{sample.labels['route']} {sample.labels['outcome']}"
                found[key] = found.get(key, 0.0) + sample.value
    return found


def test_a_completion_through_the_openai_client(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny", "page-chat"]
    answer = client.completions.create(model="tiny", prompt="edge stage token", max_tokens=8,
                                       extra_body={"ignore_eos": True}, **GREEDY)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert answer.model == "tiny" and answer.object == "text_completion"
    streamed = client.completions.create(model="tiny", prompt="edge stage token",
                                         max_tokens=8, stream=True,
                                         extra_body={"ignore_eos": True}, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0) as other, \
            pytest.raises(openai.AuthenticationError):
        other.models.list()
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, top_p=2.0)


def test_128_choices_whose_texts_are_over_a_headers_limit_are_answered_whole(
        server: Served) -> None:
    """The vLLM worker sends its texts as tensors: an event's header, its data included,
    must fit the worker channel's 64 KiB. Before, this completion was a 500
    (``EventTooLarge``: the DONE's header would have been about 130 KB)."""
    choices, tokens = 128, 250
    body = {"model": "tiny", "prompt": ["edge stage", "token worker"], "n": choices // 2,
            "max_tokens": tokens, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600,
                       headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status_code == 200, reply.text[:2000]
    answer = reply.json()
    assert [c["index"] for c in answer["choices"]] == list(range(choices))
    assert {c["finish_reason"] for c in answer["choices"]} == {"length"}
    size = sum(len(c["text"].encode("utf-8")) for c in answer["choices"])
    assert size > 65536, size
    assert answer["usage"]["completion_tokens"] == choices * tokens
    edge = answer["edge"]  # the DONE's data, its texts left out as always
    assert "text" not in edge and edge["num_tokens"] == choices * tokens
    assert [list(c) for c in edge["choices"]] == [["index", "finish_reason",
                                                  "num_tokens"]] * choices
    assert [c["num_tokens"] for c in edge["choices"]] == [tokens] * choices


def test_a_streamed_chat_completion_uses_the_models_own_template(
        client: openai.OpenAI, model: tuple[Path, Path]) -> None:
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and not any(finish[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    # Streamed, not one answer at the end: a chunk of tokens before the finishing one.
    # Not one chunk per token: vLLM merges a request's deltas while its reader is behind
    # (``RequestOutputCollector.put``), as its own server's stream does: a loaded CI run
    # got one chunk of tokens (its text "v") and then the finishing chunk.
    tokens = [c for c in chunks[1:] if c.choices and c.choices[0].finish_reason is None]
    assert tokens  # a token's text may be empty: its chunk's delta is then empty
    # The worker rendered the chat with the model's template: the same prompt, rendered
    # and tokenised by transformers in the vLLM environment, gives the same tokens.
    python, directory = model
    ids = json.loads(subprocess.run([str(python), "-c", RENDER, str(directory),
                                     json.dumps(CHAT)], capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    same = client.completions.create(model="tiny", prompt=ids, max_tokens=10,
                                     extra_body={"ignore_eos": True}, **GREEDY)
    assert same.choices[0].text == text
    assert same.usage is not None and chunks[-1].usage.prompt_tokens == same.usage.prompt_tokens
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10,
                                           extra_body={"ignore_eos": True}, **GREEDY)
    assert whole.choices[0].message.content == text


def test_a_stream_closed_after_3_tokens_is_aborted_alone(client: openai.OpenAI,
                                                          server: Served) -> None:
    # The closed stream must still be generating when the client goes; on a loaded
    # machine the engine can finish all 230 tokens before the client has read 3 chunks
    # and closed (the server then rightly counts it "ok"). That answer is tried again,
    # with n doubled (more for the engine and the server to do per step), up to 4 times.
    tried = []
    for n in (1, 2, 4, 8):
        counts = _outcomes(server)
        before = counts.get("/v1/completions cancelled", 0.0)
        before_ok = counts.get("/v1/completions ok", 0.0)
        other = client.completions.create(model="tiny", prompt="stream on", max_tokens=40,
                                          stream=True, extra_body={"ignore_eos": True},
                                          **GREEDY)
        # several choices need sampling (greedy ones would all be the same: refused)
        sampling = GREEDY if n == 1 else {"temperature": 1.0, "seed": 7}
        closed = client.completions.create(model="tiny", prompt="abort me", max_tokens=230,
                                           n=n, stream=True, extra_body={"ignore_eos": True},
                                           **sampling)
        taken = []
        for chunk in closed:
            taken.append(chunk.choices[0].text)
            if len(taken) == 3:
                break
        closed.close()
        deadline = time.monotonic() + 60
        while True:
            counts = _outcomes(server)
            if counts.get("/v1/completions cancelled", 0.0) >= before + 1:
                break
            if counts.get("/v1/completions ok", 0.0) >= before_ok + 2:
                break  # both ended whole: the closed one finished before its client went
            assert time.monotonic() < deadline, counts
            time.sleep(0.05)
        rest = list(other)  # the other stream runs on to its end
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
        assert len(taken) + len(rest) >= 40 // 2
        cancelled = counts.get("/v1/completions cancelled", 0.0) >= before + 1
        tried.append((n, cancelled))
        if cancelled:
            break
    else:
        pytest.fail(f"every closed stream finished before its client closed it: {tried}")
    # The engine lets the aborted request go (it had over 200 tokens left).
    unfinished = engine_unfinished_after_abort(server)
    assert unfinished[-1] == 0, (tried, unfinished)
    assert _outcomes(server).get("/v1/completions cancelled", 0.0) == before + 1


def test_a_passed_deadline_is_504_and_aborts_the_request(client: openai.OpenAI,
                                                         server: Served) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="tiny", prompt="too long", max_tokens=230,
                                  extra_body={"ignore_eos": True, "deadline_s": 0.3}, **GREEDY)
    assert caught.value.status_code == 504
    assert "deadline" in caught.value.message
    unfinished = engine_unfinished_after_abort(server)
    assert unfinished[-1] == 0, unfinished


def _field(error: openai.APIStatusError) -> str:
    """The field at fault as edge names it (``error.edge.field``; the SDK's ``body`` is
    the error object)."""
    body = error.body if isinstance(error.body, dict) else {}
    edge = body.get("edge")
    return str(edge.get("field")) if isinstance(edge, dict) else ""


def test_a_chat_with_a_page_image_goes_through_ocr_then_the_model(
        client: openai.OpenAI, ocr_dir: Path) -> None:
    from edge_ocr_example.prompt import PAGE_HEADING

    page = base64.b64encode((ocr_dir / "page.png").read_bytes()).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{page}"}}
    question = "What does the page say?"
    messages: list[Any] = [CHAT[0], {"role": "user", "content": [
        {"type": "text", "text": question}, image]}]
    whole = client.chat.completions.create(model="page-chat", messages=messages,
                                           max_tokens=6, extra_body={"ignore_eos": True},
                                           **GREEDY)
    # The worker received the caller's chat (image part removed), then the page's text.
    sent = [["system", CHAT[0]["content"]], ["user", question],
            ["user", PAGE_HEADING + PAGE_TEXT]]
    digest = hashlib.sha256(json.dumps(sent, ensure_ascii=False).encode()).hexdigest()
    edge = (whole.model_extra or {})["edge"]
    assert edge["prompt_sha256"] == digest
    # the placement receipt rides in the edge object: each stage's backend, provider,
    # worker generation and where the decision came from; a strict client parses it
    assert [s["stage"] for s in edge["placement"]][-1] == "gen"
    assert all({"backend", "provider", "generation", "decision"} <= set(s)
               for s in edge["placement"])
    assert whole.usage is not None and whole.usage.completion_tokens == 6
    streamed = client.chat.completions.create(model="page-chat", messages=messages,
                                              max_tokens=6, stream=True,
                                              extra_body={"ignore_eos": True}, **GREEDY)
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c for c in chunks if (c.model_extra or {}).get("edge")]
    assert finishing and finishing[-1].model_extra["edge"]["placement"] == edge["placement"]

    refused = [
        (lambda: client.completions.create(model="page-chat", prompt="x", max_tokens=2),
         "prompt"),
        (lambda: client.chat.completions.create(model="page-chat", messages=CHAT,
                                                max_tokens=2), "messages"),
        (lambda: client.chat.completions.create(
            model="page-chat", max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]),
         "messages[0].content[0].image_url.url"),
        (lambda: client.chat.completions.create(
            model="page-chat", max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]),
         "messages[0].content[0].image_url"),
        (lambda: client.chat.completions.create(
            model="page-chat", max_tokens=2, messages=[{"role": "user", "content": [
                image, image]}]), "messages[0].content[1]"),
        (lambda: client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": [image]}]), "messages[0].content[0]"),
    ]
    for call, field in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert _field(caught.value) == field, caught.value.body
