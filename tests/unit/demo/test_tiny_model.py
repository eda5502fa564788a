"""The tiny model directory loads offline with the Auto classes, generates, and is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from rollway.demo.tiny_model import (
    PROMPT_WORDS,
    build_config,
    build_tokenizer,
    count_parameters,
    make_tiny_model,
)

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _load(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return tokenizer, model


def test_loads_offline_as_qwen3_with_about_one_million_parameters(tiny_dir):
    tokenizer, model = _load(tiny_dir)
    assert isinstance(model, Qwen3ForCausalLM)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) < 512
    assert 1_000_000 <= count_parameters(model) <= 1_100_000
    for name in MODEL_FILES:
        assert (tiny_dir / name).is_file(), name


def test_small_preset_has_about_fifty_million_parameters():
    config = build_config(build_tokenizer(), preset="small")
    with torch.device("meta"):  # count without allocating or initialising 200 MB
        model = Qwen3ForCausalLM(config)
    assert 48_000_000 <= count_parameters(model) <= 53_000_000


def test_overrides_set_config_fields_and_bad_values_fail(tmp_path):
    path = make_tiny_model(tmp_path, num_hidden_layers=2, intermediate_size=256, vocab_size=448)
    _, model = _load(path)
    assert model.config.num_hidden_layers == 2
    assert model.config.intermediate_size == 256
    assert model.get_input_embeddings().weight.shape == (448, 128)
    with pytest.raises(ValueError, match="vocab_size"):
        build_config(build_tokenizer(), vocab_size=100)
    with pytest.raises(ValueError, match="preset"):
        make_tiny_model(tmp_path / "x", preset="huge")


def test_special_tokens_and_generation_config(tiny_dir):
    tokenizer, model = _load(tiny_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == pad
    assert tokenizer.bos_token is None
    assert model.config.eos_token_id == im_end and model.config.pad_token_id == pad
    assert model.generation_config.eos_token_id == [im_end, pad]
    assert model.generation_config.pad_token_id == pad
    # Special tokens are atomic in text, never split into bytes.
    assert tokenizer("<|im_start|><|im_end|>")["input_ids"] == [
        tokenizer.convert_tokens_to_ids("<|im_start|>"),
        im_end,
    ]


def test_generate_produces_new_tokens(tiny_dir):
    tokenizer, model = _load(tiny_dir)
    messages = [{"role": "user", "content": "What is 37 + 45?"}]
    inputs = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    prompt_len = inputs["input_ids"].shape[1]
    output = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert output.shape == (1, prompt_len + 6)
    assert torch.equal(output[0, :prompt_len], inputs["input_ids"][0])
    assert int(output[0, prompt_len:].max()) < len(tokenizer)


def test_chat_template_is_chatml(tiny_dir):
    tokenizer, _ = _load(tiny_dir)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 37 + 45?"},
        {"role": "assistant", "content": "82"},
    ]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 37 + 45?<|im_end|>\n"
        "<|im_start|>assistant\n82<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 37 + 45?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages[1:2], tokenize=True, add_generation_prompt=True)["input_ids"]
    assert tokenizer.decode(ids) == prompt


def test_assistant_mask_covers_the_answer_and_im_end(tiny_dir):
    tokenizer, _ = _load(tiny_dir)
    messages = [{"role": "user", "content": "What is 37 + 45?"}, {"role": "assistant", "content": "82"}]
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [i for i, m in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(masked) == "82<|im_end|>"


@pytest.mark.parametrize(
    "text",
    [
        "héllo wörld",
        "数学 🙂 ∑ x² ≠ y",
        "tabs\tand\r\nnewlines\n\n",
        "  leading and trailing  ",
        "\x00\x7f",
        "",
    ],
)
def test_any_text_round_trips(tiny_dir, text):
    tokenizer, _ = _load(tiny_dir)
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_digits_are_single_tokens_and_prompt_words_are_one_token(tiny_dir):
    tokenizer, _ = _load(tiny_dir)
    assert tokenizer.convert_ids_to_tokens(tokenizer("1234567890")["input_ids"]) == list("1234567890")
    for word in PROMPT_WORDS:
        assert len(tokenizer(word)["input_ids"]) == 1, word
        assert len(tokenizer(" " + word)["input_ids"]) == 1, word
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("What is 37 + 45?")["input_ids"])
    assert tokens == ["What", "Ġis", "Ġ", "3", "7", "Ġ+", "Ġ", "4", "5", "?"]  # Ġ is GPT-2's byte for space


def test_same_seed_gives_identical_files_and_other_seeds_differ(tmp_path):
    first = make_tiny_model(tmp_path / "a", seed=3)
    second = make_tiny_model(tmp_path / "b", seed=3)
    other = make_tiny_model(tmp_path / "c", seed=4)
    for name in MODEL_FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_building_does_not_disturb_the_callers_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    make_tiny_model(tmp_path, seed=7)
    assert torch.equal(torch.rand(4), expected)
