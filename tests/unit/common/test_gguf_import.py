"""`rollway import-gguf` refuses what it cannot convert, naming why, and writes nothing; a GGUF file
written as llama.cpp writes one (tests/support/gguf_files.py) converts back to the same model."""

from __future__ import annotations

import pytest
from support.gguf_files import tiny_llama, write_llama_gguf, write_metadata_only_gguf

from rollway.cli import main
from rollway.common.gguf_import import GgufImportError, import_gguf


def test_a_file_that_is_not_gguf_is_refused_naming_its_first_bytes(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(GgufImportError, match=r"not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        import_gguf(fake, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_missing_file_and_a_full_directory_are_refused(tmp_path):
    with pytest.raises(GgufImportError, match="no such file"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    real = tmp_path / "model.gguf"
    real.write_bytes(b"GGUF" + b"\0" * 16)
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    with pytest.raises(GgufImportError, match="is not empty"):
        import_gguf(real, full)
    assert [p.name for p in full.iterdir()] == ["config.json"]


def test_a_truncated_gguf_file_is_refused_by_the_command_with_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00")  # the header ends after its version
    assert main(["import-gguf", str(broken), str(tmp_path / "out")]) == 2
    assert "rollway import-gguf: broken.gguf: transformers cannot convert it" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_architecture_transformers_cannot_read_is_refused_naming_it_and_those_it_can(tmp_path):
    rwkv = write_metadata_only_gguf(tmp_path / "rwkv.gguf", "rwkv7")
    with pytest.raises(GgufImportError) as refused:
        import_gguf(rwkv, tmp_path / "out")
    message = str(refused.value)
    assert message.startswith("rwkv.gguf: transformers cannot convert it: ")
    assert "architecture rwkv7 is not supported" in message
    readable = message.split("reads GGUF files of: ")[1].rstrip(")").split(", ")
    assert {"llama", "qwen3", "mistral"} <= set(readable) and "general" not in readable
    assert not (tmp_path / "out").exists()


def test_a_llama_gguf_converts_to_the_same_weights_tokenizer_and_template(tmp_path):
    """A tiny Llama written as llama.cpp writes one (rope-permuted q/k, no output.weight, tokenizer
    as metadata) comes back tensor for tensor: the permutation undone, the embeddings tied again."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = tiny_llama(seed=3)
    gguf_file = write_llama_gguf(tmp_path / "tiny-llama.F32.gguf", model, tokenizer)
    assert main(["import-gguf", str(gguf_file), str(tmp_path / "hf")]) == 0

    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(converted).__name__ == "LlamaForCausalLM"
    assert converted.config.tie_word_embeddings
    assert converted.lm_head.weight is converted.model.embed_tokens.weight
    expected, got = model.state_dict(), converted.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert "quantization_config" not in converted.config.to_dict()

    converted_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert converted_tokenizer.chat_template == tokenizer.chat_template
    assert (converted_tokenizer.eos_token, converted_tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    messages = [{"role": "user", "content": "What is 37 + 45?"}, {"role": "assistant", "content": "82"}]
    assert (
        converted_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    )


def test_the_command_prints_what_it_wrote(tmp_path, capsys):
    import json

    model, tokenizer = tiny_llama(seed=1, tie_word_embeddings=False)
    gguf_file = write_llama_gguf(tmp_path / "untied.gguf", model, tokenizer)
    assert main(["import-gguf", str(gguf_file), str(tmp_path / "hf")]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["architecture"] == "LlamaForCausalLM"
    assert written["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert written["vocab_size"] == len(tokenizer) and written["tie_word_embeddings"] is False
    assert written["chat_template"] is True and written["max_logit_difference"] == 0.0
