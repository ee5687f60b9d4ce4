"""A generate request's parameters: the prompt and the sampling settings, checked.

Standard library only: the controller checks a request here before anything is sent, and
the worker (which imports only ``edge_contracts``, numpy and vLLM besides this package)
checks it again before it reaches the engine. Every error names the field, the reason and
the value, and declares itself the request's own fault
(:mod:`edge_contracts.request_faults`): a front end answers it with 400 naming the field.

The context check (:func:`check_context`) needs the prompt's length in tokens: the
controller applies it to what it can count without a tokenizer (token-id prompts, and a
``max_tokens`` no prompt could fit beside), the worker to every prompt after rendering and
tokenising it, before the engine sees the request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_contracts.error_copies import whole_reduction

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_CHOICES",
    "MAX_LOGPROBS",
    "PARAM_NAMES",
    "ContextLengthExceeded",
    "GenerateParams",
    "GenerateParamsInvalid",
    "Prompt",
    "check_context",
    "parse_generate_params",
]

#: The largest prompt (characters or token ids) and generation accepted per request.
MAX_PROMPT_ITEMS = 1_000_000
MAX_TOKENS_LIMIT = 1_000_000
MAX_MESSAGES = 10_000
#: Tokens generated when the request names no ``max_tokens`` (as vLLM's server), cut to
#: what the context leaves after the prompt.
DEFAULT_MAX_TOKENS = 16
#: Most alternatives per token ``logprobs`` may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20
#: Most choices one request may ask for: prompts times ``n``.
MAX_CHOICES = 128
#: Every parameter a generate request may carry (the backend declares them,
#: ``BackendInfo.params``); any other is refused as ``unsupported_parameter``.
PARAM_NAMES = frozenset({"prompt", "prompt_token_ids", "prompts", "messages", "max_tokens",
                    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "ignore_eos",
                    "min_tokens", "n", "logprobs", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "json_object", "json_schema"})
_PROMPT_FORMS = ("prompt", "prompt_token_ids", "prompts", "messages")

#: One prompt as the engine takes it: text, or token ids.
Prompt = str | tuple[int, ...]


class GenerateParamsInvalid(ValueError):
    """A generate request's parameters are malformed; ``field: reason: value``.

    The request's own fault: ``request_fault`` is its code word (``invalid_value``, or
    ``unsupported_parameter`` for a parameter the backend does not know).
    """

    request_fault = "invalid_value"

    def __init__(self, field: str, reason: str, value: object,
                 also: tuple[GenerateParamsInvalid, ...] = (), *,
                 code: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        if code is not None:
            self.request_fault = code
        #: The other problems found in the request, after this one.
        self.also = also
        shown = repr(value)
        message = f"params.{field}: {reason}: {shown[:200]}"
        super().__init__("; ".join([message, *(str(extra) for extra in also)]))

    @property
    def problems(self) -> tuple[GenerateParamsInvalid, ...]:
        """Every problem found in the request, this one first."""
        return (self, *self.also)

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


class ContextLengthExceeded(GenerateParamsInvalid):
    """A prompt, ``max_tokens``, or the two together do not fit in the stage's context.

    ``field`` names the limit at fault: the prompt's field when the prompt alone leaves no
    room for one generated token, ``max_tokens`` otherwise; the reason says by how much.
    """

    request_fault = "context_length_exceeded"


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """One generate request: one prompt form (text, token ids, several, or a chat) plus sampling.

    Attributes:
        prompt: Prompt text (tokenised by the worker with the model's tokenizer).
        prompt_token_ids: Prompt as token ids.
        messages: A chat as ``(role, content)`` pairs; the worker renders it with the
            model's own chat template (generation prompt added) and tokenises the result.
        prompts: Several prompts (each text or token ids), each answered by ``n`` choices;
            choice ``i * n + j`` is prompt ``i``'s ``j``-th.
        max_tokens: Tokens to generate at most per choice, or None: up to
            :data:`DEFAULT_MAX_TOKENS`, cut to what the context leaves.
        temperature: 0 means greedy.
        top_p: Nucleus mass in (0, 1].
        top_k: 0 or -1 disables; else the candidates kept.
        min_p: Least probability, relative to the likeliest token, to keep (0 disables).
        seed: Per-request sampling seed, or None.
        stop: Strings that end generation.
        ignore_eos: Keep generating past the end-of-sequence token.
        min_tokens: Tokens generated before stop conditions apply.
        n: Choices generated per prompt (more than one needs ``temperature > 0``).
        logprobs: With each token, its log-probability and this many likeliest
            alternatives (0: none), or None: no log-probabilities.
        presence_penalty: In [-2, 2]: penalises tokens already generated, once each.
        frequency_penalty: In [-2, 2]: penalises tokens by how often they were generated.
        repetition_penalty: Above 0; 1 disables (vLLM's multiplicative penalty).
        json_object: Guided decoding to a JSON object (the engine's structured output).
        json_schema: Guided decoding to JSON matching this schema, or None.
    """

    prompt: str | None
    prompt_token_ids: tuple[int, ...] | None
    messages: tuple[tuple[str, str], ...] | None = None
    prompts: tuple[Prompt, ...] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_object: bool = False
    json_schema: Mapping[str, Any] | None = None

    @property
    def prompt_field(self) -> str:
        """The parameter the prompt came in (named by a refusal of the prompt)."""
        if self.messages is not None:
            return "messages"
        if self.prompts is not None:
            return "prompts"
        return "prompt" if self.prompt is not None else "prompt_token_ids"

    def engine_prompts(self) -> tuple[Prompt, ...]:
        """Every prompt, in choice order (a chat has none: the worker renders it)."""
        if self.messages is not None:
            raise ValueError("messages: a chat is rendered by the worker with the model's "
                             f"chat template, not as an engine prompt: {len(self.messages)} "
                             "message(s)")
        if self.prompts is not None:
            return self.prompts
        if self.prompt_token_ids is not None:
            return (self.prompt_token_ids,)
        assert self.prompt is not None
        return (self.prompt,)

    def engine_prompt(self) -> dict[str, Any]:
        """The one prompt as vLLM's ``TextPrompt`` / ``TokensPrompt`` dictionary."""
        (prompt,) = self.engine_prompts()
        if isinstance(prompt, str):
            return {"prompt": prompt}
        return {"prompt_token_ids": list(prompt)}

    @property
    def choices(self) -> int:
        """Choices this request produces: prompts times ``n`` (a chat is one prompt)."""
        return (len(self.prompts) if self.prompts is not None else 1) * self.n

    def sampling_kwargs(self, max_tokens: int | None = None) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams``, output kind and guided decoding aside.

        The worker builds guided decoding from :attr:`json_object` / :attr:`json_schema`.

        Args:
            max_tokens: The budget to use instead of :attr:`max_tokens` (the worker's,
                after the context check); default: :attr:`max_tokens` or
                :data:`DEFAULT_MAX_TOKENS`.
        """
        budget = max_tokens if max_tokens is not None else (
            self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS)
        return {"max_tokens": budget, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "stop": list(self.stop) or None,
                "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens, "n": self.n,
                "logprobs": self.logprobs, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty,
                "repetition_penalty": self.repetition_penalty}


def check_context(prompt_tokens: int, params: GenerateParams, max_model_len: int,
                  field: str | None = None) -> int:
    """Refuse a prompt and ``max_tokens`` that do not fit the context; the token budget.

    Args:
        prompt_tokens: The prompt's length in tokens.
        params: The request (its ``max_tokens`` and prompt field).
        max_model_len: The stage's context length (prompt plus generation), in tokens.
        field: The prompt's field when it is not ``params.prompt_field``
            (``prompts[2]``).

    Returns:
        Tokens to generate at most: ``max_tokens`` as asked, or without one the default
        cut to what the context leaves.

    Raises:
        ContextLengthExceeded: the prompt leaves no room for one generated token (naming
            the prompt's field), or ``max_tokens`` does not fit beside the prompt (naming
            ``max_tokens``); the reason says by how many tokens.
    """
    where = field or params.prompt_field
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(
            where, f"the prompt has {prompt_tokens} tokens; the stage's context holds "
            f"{max_model_len} tokens, prompt and generation together: {1 - room} too many "
            "to generate even one token", prompt_tokens)
    if params.max_tokens is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if params.max_tokens > room:
        raise ContextLengthExceeded(
            "max_tokens", f"the prompt has {prompt_tokens} tokens and max_tokens asks for "
            f"{params.max_tokens} more: {prompt_tokens + params.max_tokens} in all exceeds "
            f"the stage's context of {max_model_len} tokens by "
            f"{prompt_tokens + params.max_tokens - max_model_len}; at most {room} can be "
            "generated after this prompt", params.max_tokens)
    return params.max_tokens


def _int(params: Mapping[str, Any], field: str, default: int | None, low: int,
         high: int) -> int | None:
    value = params.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GenerateParamsInvalid(field, f"must be an integer in [{low}, {high}]", value)
    return value


def _float(params: Mapping[str, Any], field: str, default: float, low: float, high: float,
           *, low_open: bool = False) -> float:
    value = params.get(field, default)
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (value > low if low_open else value >= low)
          and value <= high)
    if not ok:
        bracket = "(" if low_open else "["
        raise GenerateParamsInvalid(field, f"must be a number in {bracket}{low}, {high}]", value)
    return float(value)


def _messages(value: object) -> tuple[tuple[str, str], ...]:
    """A chat: a non-empty list of ``{"role": str, "content": str}``."""
    if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_MESSAGES:
        raise GenerateParamsInvalid("messages", f"must be a non-empty list of at most "
                                    f"{MAX_MESSAGES} messages", value)
    chat: list[tuple[str, str]] = []
    total = 0
    for index, message in enumerate(value):
        field = f"messages[{index}]"
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise GenerateParamsInvalid(field, 'must be an object with exactly "role" and '
                                        '"content"', message)
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not role:
            raise GenerateParamsInvalid(f"{field}.role", "must be a non-empty string", role)
        if not isinstance(content, str):
            raise GenerateParamsInvalid(f"{field}.content", "must be a string", content)
        total += len(content)
        chat.append((role, content))
    if total > MAX_PROMPT_ITEMS:
        raise GenerateParamsInvalid("messages", f"more than {MAX_PROMPT_ITEMS} characters of "
                                    "content", total)
    return tuple(chat)


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_PROMPT_ITEMS:
        raise GenerateParamsInvalid(
            field, f"must be a non-empty string of at most {MAX_PROMPT_ITEMS} characters",
            value)
    return value


def _ids(value: object, field: str) -> tuple[int, ...]:
    if (not isinstance(value, (list, tuple)) or not value or len(value) > MAX_PROMPT_ITEMS
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value)):
        raise GenerateParamsInvalid(
            field, f"must be a non-empty list of at most {MAX_PROMPT_ITEMS} integers >= 0",
            value)
    return tuple(value)


def _prompts(value: object) -> tuple[Prompt, ...]:
    """Several prompts: a non-empty list of texts or token-id lists."""
    if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_CHOICES:
        raise GenerateParamsInvalid("prompts", f"must be a non-empty list of at most "
                                    f"{MAX_CHOICES} prompts (texts or token-id lists)", value)
    found: list[Prompt] = []
    for index, item in enumerate(value):
        field = f"prompts[{index}]"
        found.append(_text(item, field) if isinstance(item, str) else _ids(item, field))
    if sum(len(p) for p in found) > MAX_PROMPT_ITEMS:
        raise GenerateParamsInvalid("prompts", f"more than {MAX_PROMPT_ITEMS} characters or "
                                    "token ids in all", sum(len(p) for p in found))
    return tuple(found)


def _json_schema(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise GenerateParamsInvalid("json_schema", "must be a JSON Schema object", value)
    return dict(value)


def parse_generate_params(params: Mapping[str, Any]) -> GenerateParams:
    """Check a request's parameters; return them typed.

    Raises:
        GenerateParamsInvalid: an unknown key, not exactly one prompt form, an empty prompt,
            a token id that is not a non-negative integer, a malformed chat message, a
            sampling value out of range, or settings that do not go together (``n`` above
            1 with greedy sampling, ``min_tokens`` above ``max_tokens``, both guided
            decoding forms, more than :data:`MAX_CHOICES` choices).
    """
    problems: list[GenerateParamsInvalid] = [
        GenerateParamsInvalid(key, f"unknown parameter (known: {sorted(PARAM_NAMES)})", params[key],
                              code="unsupported_parameter")
        for key in sorted(set(params) - PARAM_NAMES, key=str)]

    def checked(check: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except GenerateParamsInvalid as exc:
            problems.append(exc)
            return None

    form = checked(_prompt_form, params)
    stop = checked(_stop, params)
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        problems.append(GenerateParamsInvalid("ignore_eos", "must be a boolean", ignore_eos))
    json_object = params.get("json_object", False)
    if not isinstance(json_object, bool):
        problems.append(GenerateParamsInvalid("json_object", "must be a boolean", json_object))
    json_schema = checked(_json_schema, params.get("json_schema"))
    top_k = checked(_int, params, "top_k", 0, -1, 1_000_000)
    max_tokens = checked(_int, params, "max_tokens", None, 1, MAX_TOKENS_LIMIT)
    temperature = checked(_float, params, "temperature", 1.0, 0.0, 100.0)
    top_p = checked(_float, params, "top_p", 1.0, 0.0, 1.0, low_open=True)
    min_p = checked(_float, params, "min_p", 0.0, 0.0, 1.0)
    seed = checked(_int, params, "seed", None, 0, 2**63 - 1)
    min_tokens = checked(_int, params, "min_tokens", 0, 0, MAX_TOKENS_LIMIT)
    n = checked(_int, params, "n", 1, 1, MAX_CHOICES)
    logprobs = checked(_int, params, "logprobs", None, 0, MAX_LOGPROBS)
    presence = checked(_float, params, "presence_penalty", 0.0, -2.0, 2.0)
    frequency = checked(_float, params, "frequency_penalty", 0.0, -2.0, 2.0)
    repetition = checked(_float, params, "repetition_penalty", 1.0, 0.0, 100.0,
                         low_open=True)
    if not problems:  # settings that must go together, once each is valid on its own
        _together(problems, form, max_tokens, min_tokens, n, temperature, json_object,
                  json_schema)
    if problems:  # all of them at once, the first one's field leading
        first = problems[0]
        error = type(first)(first.field, first.reason, first.value, tuple(problems[1:]))
        error.request_fault = first.request_fault
        raise error
    prompt, token_ids, messages, prompts = form
    return GenerateParams(
        prompt=prompt, prompt_token_ids=token_ids, messages=messages, prompts=prompts,
        max_tokens=max_tokens, temperature=temperature, top_p=top_p,
        top_k=top_k if top_k is not None else 0, min_p=min_p, seed=seed, stop=stop,
        ignore_eos=ignore_eos, min_tokens=min_tokens or 0, n=n, logprobs=logprobs,
        presence_penalty=presence, frequency_penalty=frequency,
        repetition_penalty=repetition, json_object=json_object, json_schema=json_schema,
    )


def _together(problems: list[GenerateParamsInvalid], form: Any, max_tokens: int | None,
              min_tokens: int, n: int, temperature: float, json_object: bool,
              json_schema: Mapping[str, Any] | None) -> None:
    prompts = form[3]
    if n > 1 and temperature == 0.0:
        problems.append(GenerateParamsInvalid(
            "n", "more than one choice needs temperature > 0 (greedy sampling has one "
            "answer)", n))
    if prompts is not None and len(prompts) * n > MAX_CHOICES:
        problems.append(GenerateParamsInvalid(
            "n", f"prompts times n must be at most {MAX_CHOICES} choices: "
            f"{len(prompts)} x {n}", n))
    if max_tokens is not None and min_tokens > max_tokens:
        problems.append(GenerateParamsInvalid(
            "min_tokens", f"must be at most max_tokens ({max_tokens})", min_tokens))
    if json_object and json_schema is not None:
        problems.append(GenerateParamsInvalid(
            "json_schema", "give json_object or json_schema, not both", json_schema))


def _prompt_form(
    params: Mapping[str, Any],
) -> tuple[str | None, tuple[int, ...] | None, tuple[tuple[str, str], ...] | None,
           tuple[Prompt, ...] | None]:
    """Check the prompt form; return (text, token ids, chat, several): one of them set."""
    given = [form for form in _PROMPT_FORMS if params.get(form) is not None]
    if len(given) != 1:
        raise GenerateParamsInvalid(
            "prompt", "give exactly one of prompt, prompt_token_ids, prompts and messages",
            {form: params.get(form) for form in _PROMPT_FORMS})
    if given[0] == "messages":
        return None, None, _messages(params["messages"]), None
    if given[0] == "prompts":
        return None, None, None, _prompts(params["prompts"])
    if given[0] == "prompt":
        return _text(params["prompt"], "prompt"), None, None, None
    return None, _ids(params["prompt_token_ids"], "prompt_token_ids"), None, None


def _stop(params: Mapping[str, Any]) -> tuple[str, ...]:
    stop = params.get("stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise GenerateParamsInvalid("stop", "must be a string or a list of non-empty strings",
                                    stop)
    return tuple(stop)
