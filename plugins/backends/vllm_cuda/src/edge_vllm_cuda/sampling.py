"""A generate request's parameters: the prompt and the sampling settings, checked.

Standard library only: the controller checks a request here before anything is sent, and
the worker (which imports only ``edge_contracts``, numpy and vLLM besides this package)
checks it again before it reaches the engine. Every error names the field, the reason and
the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GenerateParams", "GenerateParamsInvalid", "parse_generate_params"]

#: The largest prompt (characters or token ids) and generation accepted per request.
MAX_PROMPT_ITEMS = 1_000_000
MAX_TOKENS_LIMIT = 1_000_000
MAX_MESSAGES = 10_000
_KNOWN = frozenset({"prompt", "prompt_token_ids", "messages", "max_tokens", "temperature",
                    "top_p", "top_k", "seed", "stop", "ignore_eos", "min_tokens"})
_PROMPT_FORMS = ("prompt", "prompt_token_ids", "messages")


class GenerateParamsInvalid(ValueError):
    """A generate request's parameters are malformed; ``field: reason: value``."""

    def __init__(self, field: str, reason: str, value: object,
                 also: tuple[GenerateParamsInvalid, ...] = ()) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        #: Every problem found in the request, this one first.
        self.problems: tuple[GenerateParamsInvalid, ...] = (self, *also)
        shown = repr(value)
        message = f"params.{field}: {reason}: {shown[:200]}"
        super().__init__("; ".join([message, *(str(extra) for extra in also)]))


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """One generate request: one prompt form (text, token ids or a chat) plus sampling.

    Attributes:
        prompt: Prompt text (tokenised by the engine).
        prompt_token_ids: Prompt as token ids.
        messages: A chat as ``(role, content)`` pairs; the worker renders it with the
            model's own chat template (generation prompt added) and tokenises the result.
        max_tokens: Tokens to generate at most.
        temperature: 0 means greedy.
        top_p: Nucleus mass in (0, 1].
        top_k: 0 or -1 disables; else the candidates kept.
        seed: Per-request sampling seed, or None.
        stop: Strings that end generation.
        ignore_eos: Keep generating past the end-of-sequence token.
        min_tokens: Tokens generated before stop conditions apply.
    """

    prompt: str | None
    prompt_token_ids: tuple[int, ...] | None
    messages: tuple[tuple[str, str], ...] | None = None
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    def engine_prompt(self) -> dict[str, Any]:
        """The prompt as vLLM's ``TextPrompt`` / ``TokensPrompt`` dictionary.

        A chat (``messages``) needs the model's tokenizer: the worker renders it instead.
        """
        if self.messages is not None:
            raise ValueError("messages: a chat is rendered by the worker with the model's "
                             f"chat template, not as an engine prompt: {len(self.messages)} "
                             "message(s)")
        if self.prompt_token_ids is not None:
            return {"prompt_token_ids": list(self.prompt_token_ids)}
        return {"prompt": self.prompt}

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams`` (output kind aside)."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                "stop": list(self.stop) or None, "ignore_eos": self.ignore_eos,
                "min_tokens": self.min_tokens}


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


def parse_generate_params(params: Mapping[str, Any]) -> GenerateParams:
    """Check a request's parameters; return them typed.

    Raises:
        GenerateParamsInvalid: an unknown key, not exactly one prompt form, an empty prompt,
            a token id that is not a non-negative integer, a malformed chat message, or a
            sampling value out of range.
    """
    problems: list[GenerateParamsInvalid] = [
        GenerateParamsInvalid(key, f"unknown parameter (known: {sorted(_KNOWN)})", params[key])
        for key in sorted(set(params) - _KNOWN, key=str)]

    def checked(check: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except GenerateParamsInvalid as exc:
            problems.append(exc)
            return None

    prompt_form = checked(_prompt, params)
    token_ids, messages = prompt_form if prompt_form is not None else (None, None)
    stop = checked(_stop, params)
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        problems.append(GenerateParamsInvalid("ignore_eos", "must be a boolean", ignore_eos))
    top_k = checked(_int, params, "top_k", 0, -1, 1_000_000)
    max_tokens = checked(_int, params, "max_tokens", 16, 1, MAX_TOKENS_LIMIT)
    temperature = checked(_float, params, "temperature", 1.0, 0.0, 100.0)
    top_p = checked(_float, params, "top_p", 1.0, 0.0, 1.0, low_open=True)
    seed = checked(_int, params, "seed", None, 0, 2**63 - 1)
    min_tokens = checked(_int, params, "min_tokens", 0, 0, MAX_TOKENS_LIMIT)
    if problems:  # all of them at once, the first one's field leading
        first = problems[0]
        raise GenerateParamsInvalid(first.field, first.reason, first.value, tuple(problems[1:]))
    prompt = params.get("prompt")
    return GenerateParams(
        prompt=prompt, prompt_token_ids=token_ids, messages=messages,
        max_tokens=max_tokens or 16, temperature=temperature, top_p=top_p,
        top_k=top_k if top_k is not None else 0, seed=seed,
        stop=stop, ignore_eos=ignore_eos, min_tokens=min_tokens or 0,
    )


def _prompt(
    params: Mapping[str, Any],
) -> tuple[tuple[int, ...] | None, tuple[tuple[str, str], ...] | None]:
    """Check the prompt form; return the token ids or the chat, whichever was given."""
    prompt = params.get("prompt")
    ids = params.get("prompt_token_ids")
    given = [form for form in _PROMPT_FORMS if params.get(form) is not None]
    if len(given) != 1:
        raise GenerateParamsInvalid(
            "prompt", "give exactly one of prompt, prompt_token_ids and messages",
            {form: params.get(form) for form in _PROMPT_FORMS})
    if given[0] == "messages":
        return None, _messages(params["messages"])
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt or len(prompt) > MAX_PROMPT_ITEMS:
            raise GenerateParamsInvalid(
                "prompt", f"must be a non-empty string of at most {MAX_PROMPT_ITEMS} characters",
                prompt)
        return None, None
    if (not isinstance(ids, (list, tuple)) or not ids or len(ids) > MAX_PROMPT_ITEMS
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)):
        raise GenerateParamsInvalid(
            "prompt_token_ids",
            f"must be a non-empty list of at most {MAX_PROMPT_ITEMS} integers >= 0", ids)
    return tuple(ids), None


def _stop(params: Mapping[str, Any]) -> tuple[str, ...]:
    stop = params.get("stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise GenerateParamsInvalid("stop", "must be a string or a list of non-empty strings",
                                    stop)
    return tuple(stop)
