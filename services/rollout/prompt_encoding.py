"""Prompts given as text or chat messages become token ids with the served model's tokenizer.

The same way as the dataloader (so a prompt gets the same ids from either service): text is
tokenised without added special tokens; messages are rendered by the chat template with the
generation prompt (add_generation_prompt=True), and that text is tokenised the same way.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rollway.common.config import ConfigError
from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.rollout.config import RolloutConfig
from rollway.rollout.v1 import rollout_pb2

PROMPT_FORMS = ("token_ids", "text", "messages")


def load_tokenizer(config: RolloutConfig) -> Any:
    """The tokenizer of --hf-checkpoint, with --chat-template-path replacing its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.hf_checkpoint)
    if config.chat_template_path:
        try:
            tokenizer.chat_template = Path(config.chat_template_path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                "chat_template_path", f"cannot read {config.chat_template_path}: {exc}"
            ) from None
    return tokenizer


def prompt_form(field: str, prompt: rollout_pb2.Prompt) -> str:
    """Which of token_ids, text or messages the prompt gives (exactly one, else INVALID_ARGUMENT)."""
    given = [
        name
        for name, present in zip(
            PROMPT_FORMS,
            (bool(prompt.token_ids), prompt.HasField("text"), bool(prompt.messages)),
            strict=True,
        )
        if present
    ]
    if not given:
        raise InvalidArgument(f"{field}.token_ids", "empty prompt: give token_ids, text or messages")
    if len(given) > 1:
        raise InvalidArgument(
            field, f"give exactly one of token_ids, text or messages (got {' and '.join(given)})"
        )
    return given[0]


class PromptEncoder:
    """Token ids of text and message prompts (thread-safe: Generate calls run concurrently)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        # The Rust tokenizer refuses concurrent use ("Already borrowed") when a call resets
        # truncation or padding; Generate calls encode from many server threads.
        self._lock = threading.Lock()

    def encode_text(self, field: str, text: str) -> tuple[int, ...]:
        if not text:
            raise InvalidArgument(field, "must not be empty")
        with self._lock:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise InvalidArgument(field, "tokenises to no tokens")
        return tuple(ids)

    def encode_messages(self, field: str, messages) -> tuple[int, ...]:
        for i, message in enumerate(messages):
            if not message.role:
                raise InvalidArgument(f"{field}[{i}].role", "must not be empty")
        if not getattr(self.tokenizer, "chat_template", None):
            raise FailedPrecondition(
                f"{field}: the served model's tokenizer has no chat template; start the rollout "
                "service with --chat-template-path, or send text or token_ids"
            )
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        try:
            with self._lock:
                text = self.tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=True
                )
        except Exception as exc:  # the template's own checks (raise_exception) or a Jinja error
            raise InvalidArgument(
                field, f"rejected by the chat template: {type(exc).__name__}: {exc}"
            ) from None
        return self.encode_text(field, text)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Messages (and tool schemas) as the chat template writes them, with the generation prompt;
        ValueError naming the problem when the template refuses them."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("the served model's tokenizer has no chat template (--chat-template-path)")
        try:
            with self._lock:
                return self.tokenizer.apply_chat_template(
                    messages, tools=tools or None, tokenize=False, add_generation_prompt=True
                )
        except Exception as exc:  # the template's own checks (raise_exception) or a Jinja error
            raise ValueError(f"rejected by the chat template: {type(exc).__name__}: {exc}") from None

    def token_ids(self, text: str) -> tuple[int, ...]:
        """Text tokenised alone, without added special tokens (as prompts and observations are)."""
        with self._lock:
            return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

    def observation_token_ids(self, observation: str, messages: list[dict[str, str]]) -> tuple[int, ...]:
        """Token ids an environment step appends to an episode: its observation text as given, then
        its messages rendered by the chat template with the generation prompt (the model's turn
        ended on the template's end-of-turn token, so the newline the template writes after it
        comes first). Only this new text is tokenised: the episode so far is never re-tokenised."""
        text = observation
        if messages:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(
                    "the environment answered with messages but the tokenizer has no chat template"
                )
            with self._lock:
                text += "\n" + self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
        if not text:
            return ()
        with self._lock:
            return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
