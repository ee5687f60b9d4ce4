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
_KNOWN = frozenset({"prompt", "prompt_token_ids", "max_tokens", "temperature", "top_p",
                    "top_k", "seed", "stop", "ignore_eos", "min_tokens"})


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
    """One generate request: exactly one of ``prompt`` / ``prompt_token_ids`` plus sampling.

    Attributes:
        prompt: Prompt text (tokenised by the engine).
        prompt_token_ids: Prompt as token ids.
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
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    def engine_prompt(self) -> dict[str, Any]:
        """The prompt as vLLM's ``TextPrompt`` / ``TokensPrompt`` dictionary."""
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


def parse_generate_params(params: Mapping[str, Any]) -> GenerateParams:
    """Check a request's parameters; return them typed.

    Raises:
        GenerateParamsInvalid: an unknown key, both or neither prompt form, an empty prompt,
            a token id that is not a non-negative integer, or a sampling value out of range.
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

    token_ids = checked(_prompt, params)
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
        prompt=prompt, prompt_token_ids=token_ids,
        max_tokens=max_tokens or 16, temperature=temperature, top_p=top_p,
        top_k=top_k if top_k is not None else 0, seed=seed,
        stop=stop, ignore_eos=ignore_eos, min_tokens=min_tokens or 0,
    )


def _prompt(params: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Check the prompt form; return the token ids when the prompt is given as ids."""
    prompt = params.get("prompt")
    ids = params.get("prompt_token_ids")
    if (prompt is None) == (ids is None):
        raise GenerateParamsInvalid("prompt", "give exactly one of prompt and prompt_token_ids",
                                    {"prompt": prompt, "prompt_token_ids": ids})
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt or len(prompt) > MAX_PROMPT_ITEMS:
            raise GenerateParamsInvalid(
                "prompt", f"must be a non-empty string of at most {MAX_PROMPT_ITEMS} characters",
                prompt)
        return None
    if (not isinstance(ids, (list, tuple)) or not ids or len(ids) > MAX_PROMPT_ITEMS
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)):
        raise GenerateParamsInvalid(
            "prompt_token_ids",
            f"must be a non-empty list of at most {MAX_PROMPT_ITEMS} integers >= 0", ids)
    return tuple(ids)


def _stop(params: Mapping[str, Any]) -> tuple[str, ...]:
    stop = params.get("stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise GenerateParamsInvalid("stop", "must be a string or a list of non-empty strings",
                                    stop)
    return tuple(stop)
