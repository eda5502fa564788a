"""Small GGUF files written the way llama.cpp's converter writes them, for `rollway import-gguf` tests
that need no registry: a tiny Llama model (rollway's tiny byte-level BPE tokenizer and ChatML
template) whose weights are known, so a conversion can be checked tensor by tensor.

What llama.cpp's `convert_hf_to_gguf.py` does to a Llama that matters here, and is done here too:
tensors renamed to its names (`blk.0.attn_q.weight`, ...), q and k rows permuted per head (its rope
layout, which transformers undoes), no `output.weight` when the embeddings are tied, and the
tokenizer stored as metadata (tokens, types, merges, special ids, chat template).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# llama.cpp's token types (gguf.TokenType): NORMAL and CONTROL.
NORMAL, CONTROL = 1, 3


def permute_for_rope(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` of q (num_heads) or k (num_key_value_heads) rows."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def tiny_llama(seed: int = 0, tie_word_embeddings: bool = True):
    """A randomly initialised Llama (2 layers, grouped-query attention) sized to the tiny tokenizer,
    with that tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollway.demo.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a norm loaded wrongly (or offset by one) shows
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model, tokenizer


def write_llama_gguf(path: Path, model, tokenizer, name: str = "tiny-llama") -> Path:
    """`model` (a LlamaForCausalLM) and `tokenizer` (byte-level BPE) as an F32 GGUF file."""
    import json

    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be 0..n-1"
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in special else NORMAL for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # stored once, as token_embd
        weight = tensor.detach().float().numpy()
        if ".q_proj." in hf_name:
            weight = permute_for_rope(weight, config.num_attention_heads)
        elif ".k_proj." in hf_name:
            weight = permute_for_rope(weight, config.num_key_value_heads)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, f"no llama.cpp name for {hf_name}"
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_metadata_only_gguf(path: Path, architecture: str) -> Path:
    """A valid GGUF file naming `architecture`, holding one tensor and no tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"a {architecture} model")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
