"""Build a tiny Llama (random weights, locally trained tokenizer) in a directory vLLM loads.

Run with an interpreter that has torch, transformers and tokenizers (the vLLM environment):
``python tiny_llama.py OUT_DIR``. Nothing is downloaded: the tokenizer is a byte-level BPE
trained on text generated here, and the weights are random (seeded). CPU attention needs a
head size of at least 32, hence hidden size 128 over 4 heads.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
    "</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = ("edge", "stage", "token", "worker", "engine", "stream", "abort", "reserve", "pool",
         "device", "cache", "model", "prompt", "batch", "the", "a", "runs", "on", "and", "of")


def corpus(lines: int = 2000, seed: int = 7) -> list[str]:
    """Sentences of random words, enough for a few hundred merges."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) + "."
            for _ in range(lines)]


def build(out: Path) -> dict[str, object]:
    """Write tokenizer, config and random weights into ``out``; return a summary."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=False, torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    summary = {"vocab_size": len(fast), "parameters": sum(p.numel() for p in model.parameters()),
               "files": sorted(p.name for p in out.iterdir())}
    (out / "edge-tiny-llama.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
