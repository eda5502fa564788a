"""A tiny Qwen3 model and its tokenizer, built locally so tests and demos need no download.

`make_tiny_model(out_dir)` writes a real Hugging Face model directory that
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load offline:

    config.json  generation_config.json  model.safetensors      (Qwen3ForCausalLM, random init)
    tokenizer.json  tokenizer_config.json  chat_template.jinja  (byte-level BPE, ChatML template)

The tokenizer is byte-level BPE, so any text tokenizes and decodes back unchanged. Its vocabulary
is the 256 bytes, one token per word of the demo prompts (`PROMPT_WORDS`, with and without a
leading space) and three special tokens: <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos).
Digits are always single tokens, so "37" is "3", "7" wherever it appears: the model sees numbers
digit by digit, which is what lets a tiny model learn the demo addition task.

Presets (parameter counts with the default tokenizer, tied embeddings):

    tiny   1.04M  hidden 128, 4 layers, 4 heads / 2 kv heads, head_dim 32, intermediate 512
    small  50.6M  hidden 512, 16 layers, 8 heads / 4 kv heads, head_dim 64, intermediate 1536

Same seed, same preset and overrides -> byte-identical files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

__all__ = [
    "PRESETS",
    "PROMPT_WORDS",
    "CHAT_TEMPLATE",
    "PAD_TOKEN",
    "IM_START_TOKEN",
    "IM_END_TOKEN",
    "build_tokenizer",
    "build_config",
    "make_tiny_model",
    "count_parameters",
]

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
# Order fixes the ids: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

# Words of the demo prompts, chat roles and common instructions. Each becomes one token (with and
# without a leading space), so prompts are short; anything else falls back to bytes.
PROMPT_WORDS = (
    "What is the answer The sum of and plus minus times Compute Add Calculate Answer Question "
    "number numbers final Please think step by reason put your in boxed You are a helpful "
    "user assistant system"
).split()
PUNCTUATION = list("+-*/=?.,:!()")

# ChatML, as Qwen writes it, without Qwen's default system prompt. The {% generation %} block
# marks assistant text so `return_assistant_tokens_mask=True` gives SFT loss masks.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{% generation %}{{- message['content'] + '<|im_end|>' -}}{% endgeneration %}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=512,
        max_position_embeddings=1024,
    ),
    "small": dict(
        hidden_size=512,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=1536,
        max_position_embeddings=4096,
    ),
}


def _train_bpe() -> Tokenizer:
    """Byte-level BPE whose merges spell out exactly the prompt words (training is deterministic)."""
    tokenizer = Tokenizer(models.BPE())
    # Digits are split off one by one before the GPT-2 byte-level split, so no merge can join them.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,  # an upper bound: training stops once every word is a single token
        min_frequency=0,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [form for word in PROMPT_WORDS + PUNCTUATION for form in (word, " " + word)]
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def build_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The tiny tokenizer: byte-level BPE (400 tokens) with a ChatML chat template.

    eos is <|im_end|> (ends an assistant turn), pad is <|endoftext|>, there is no bos.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(),
        bos_token=None,
        eos_token=IM_END_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START_TOKEN],
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        # Byte-level decoding is exact; the clean-up would change spaces before punctuation.
        clean_up_tokenization_spaces=False,
    )


def build_config(
    tokenizer: PreTrainedTokenizerFast, preset: str = "tiny", dtype: str = "float32", **overrides: Any
) -> Qwen3Config:
    """A Qwen3Config for `preset` ("tiny" or "small"), sized to `tokenizer`; `overrides` win.

    `vocab_size` may be overridden upwards (padded rows, as real checkpoints have), never below
    the tokenizer's size.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}, expected one of {sorted(PRESETS)}")
    fields: dict[str, Any] = dict(
        PRESETS[preset],
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype=dtype,
    )
    fields.update(overrides)
    if fields["vocab_size"] < len(tokenizer):
        raise ValueError(
            f"vocab_size: {fields['vocab_size']} is below the tokenizer's {len(tokenizer)} tokens"
        )
    return Qwen3Config(architectures=["Qwen3ForCausalLM"], **fields)


def _generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    # Stop at the end of the assistant turn, or at <|endoftext|> as Qwen does.
    return GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def make_tiny_model(
    out_dir: str | Path, seed: int = 0, preset: str = "tiny", dtype: str = "float32", **overrides: Any
) -> Path:
    """Write a randomly initialised Qwen3 model and its tokenizer to `out_dir`; return the path.

    preset: "tiny" (~1.0M parameters) or "small" (~50.6M); `overrides` set any Qwen3Config field
    (hidden_size, num_hidden_layers, intermediate_size, ...). dtype: the saved weight dtype.
    Deterministic: the same arguments give byte-identical files.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}, expected one of {sorted(PRESETS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    max_length = overrides.get("max_position_embeddings", PRESETS[preset]["max_position_embeddings"])
    tokenizer = build_tokenizer(model_max_length=max_length)
    config = build_config(tokenizer, preset, dtype, **overrides)

    # A private generator state: seeding here must not disturb the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model = model.to(getattr(torch, dtype))
    model.generation_config = _generation_config(tokenizer)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    """`python -m rollway.demo.tiny_model OUT_DIR [--preset small] [--seed N]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args(argv)
    path = make_tiny_model(args.out_dir, seed=args.seed, preset=args.preset, dtype=args.dtype)
    print(path)


if __name__ == "__main__":
    main()
