"""Tokenising rows: RL prompts (with the generation prompt) and SFT conversations (with loss masks).

Token ids always come from the model's own tokenizer and chat template, tokenised without
added special tokens exactly as `apply_chat_template(tokenize=True)` does, so the trainer and
the rollout engine see the ids the model expects.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollway.dataloader.loss_mask import assistant_spans, has_generation_blocks, mask_from_offsets
from rollway.dataloader.rows import Row, RowProblem


class TokenizerError(Exception):
    """The tokenizer or chat template cannot be loaded or cannot serve the configured mode."""


@dataclass
class Encoded:
    """A tokenised row. RL: prompt_text and prompt_ids. SFT: token_ids and loss_mask."""

    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) or len(self.prompt_ids)


def load_tokenizer(directory: str, chat_template_path: str = "") -> Any:
    """The tokenizer of a Hugging Face model directory, loaded offline.

    The class named in tokenizer_config.json is loaded directly when transformers has it (what
    AutoTokenizer would pick, without the import of torch that AutoTokenizer's config machinery
    brings); otherwise AutoTokenizer. `chat_template_path` replaces the chat template.
    """
    path = Path(directory)
    if not path.is_dir():
        raise TokenizerError(f"hf_checkpoint: {directory} is not a directory")
    import transformers

    class_name = _tokenizer_class_name(path)
    tokenizer_class = None
    for name in (class_name, class_name.removesuffix("Fast")) if class_name else ():
        try:
            tokenizer_class = getattr(transformers, name, None)
        except Exception:  # a tokenizer class whose optional dependency is missing
            tokenizer_class = None
        if tokenizer_class is not None:
            break
    try:
        loader = tokenizer_class or transformers.AutoTokenizer
        tokenizer = loader.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise TokenizerError(f"hf_checkpoint: cannot load the tokenizer from {directory}: {exc}") from None
    if chat_template_path:
        try:
            tokenizer.chat_template = Path(chat_template_path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"chat_template_path: cannot read {chat_template_path}: {exc}") from None
    return tokenizer


def _tokenizer_class_name(path: Path) -> str:
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name.isidentifier() else ""


class Encoder:
    """Turns checked rows into token ids (and loss masks for SFT)."""

    def __init__(self, tokenizer: Any, sft: bool, apply_chat_template: bool):
        self.tokenizer = tokenizer
        self.sft = sft
        self.apply_chat_template = apply_chat_template
        # The prefetch thread and eval requests share the tokenizer, whose Rust side refuses
        # concurrent use ("Already borrowed") when a call resets truncation or padding.
        self._lock = threading.Lock()
        self.generation_blocks = False
        if apply_chat_template:
            try:
                template = tokenizer.get_chat_template()
            except Exception as exc:
                raise TokenizerError(
                    f"apply_chat_template: the tokenizer has no usable chat template ({exc}); "
                    "give one with --chat-template-path"
                ) from None
            self.generation_blocks = has_generation_blocks(template)
        if sft and not self.generation_blocks and not getattr(tokenizer, "is_fast", False):
            raise TokenizerError(
                "hf_checkpoint: SFT loss masks need a fast tokenizer (offsets) or a chat template "
                "with {% generation %} blocks"
            )

    def encode(self, row: Row) -> Encoded:
        """Tokenise one row; RowProblem if the chat template or the tokenizer rejects it."""
        try:
            with self._lock:
                encoded = self._encode_sft(row) if self.sft else self._encode_rl(row)
        except RowProblem:
            raise
        except Exception as exc:
            raise RowProblem(
                f"rejected by the chat template or tokenizer: {type(exc).__name__}: {exc}"
            ) from None
        if not encoded.num_tokens:
            raise RowProblem("tokenises to no tokens")
        return encoded

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: Any = None) -> str:
        """The chat template applied to `messages`, as text."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode_rl(self, row: Row) -> Encoded:
        if self.apply_chat_template:
            messages = row.input if isinstance(row.input, list) else [{"role": "user", "content": row.input}]
            text = self.render(messages, True, row.tools)
        else:
            text = row.input
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Encoded(prompt_text=text, prompt_ids=list(ids))

    def _encode_sft(self, row: Row) -> Encoded:
        messages = row.input
        if self.generation_blocks:
            out = self.tokenizer.apply_chat_template(
                messages, tools=row.tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        else:
            text, spans = assistant_spans(lambda m, gen: self.render(m, gen, row.tools), messages)
            out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, mask = list(out["input_ids"]), mask_from_offsets(out["offset_mapping"], spans)
        if not any(mask):
            raise RowProblem("the chat template renders no assistant tokens, so the loss mask is empty")
        return Encoded(token_ids=ids, loss_mask=mask)
