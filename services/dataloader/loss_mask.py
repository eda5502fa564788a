"""SFT loss masks: which tokens of a rendered conversation are the assistant's.

The conversation is rendered once with the chat template and tokenised once, exactly as
`apply_chat_template(tokenize=True)` does, so the ids are the model's. The assistant spans are
found in characters, then mapped onto the tokens through the tokenizer's offsets:

- templates with `{% generation %}` blocks mark the spans themselves
  (transformers' `return_assistant_tokens_mask`);
- other templates are rendered prefix by prefix: assistant turn i starts where the render of
  messages[:i] with the generation prompt ends, and ends where the render of messages[:i+1]
  ends, minus trailing whitespace (the newline a template puts after the end-of-turn token is
  not the assistant's). Each prefix must be a prefix of the full render; templates that
  rewrite history (e.g. drop earlier reasoning) are refused rather than masked wrongly.

A token is masked when it overlaps an assistant span, so the end-of-turn token (<|im_end|>,
<|eot_id|>, ...) written inside the turn is trained on, and the header is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rollway.dataloader.rows import RowProblem

_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")

Render = Callable[[list[dict[str, Any]], bool], str]  # (messages, add_generation_prompt) -> text


def has_generation_blocks(template: str) -> bool:
    """Whether the chat template marks assistant text with {% generation %}."""
    return bool(_GENERATION_BLOCK.search(template))


def assistant_spans(render: Render, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The full render and the [start, end) character span of each assistant turn in it."""
    full = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise RowProblem("the conversation starts with an assistant turn; nothing prompts it")
        head = render(messages[:i], True)
        through = render(messages[: i + 1], False)
        if not (full.startswith(head) and through.startswith(head) and full.startswith(through)):
            raise RowProblem(
                f"the chat template does not render this conversation prefix by prefix (at message {i}), "
                "so the assistant tokens cannot be located; use a template with {% generation %} blocks"
            )
        end = len(through.rstrip())
        if end > len(head):
            spans.append((len(head), end))
    return full, spans


def mask_from_offsets(offsets: Sequence[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose character range overlaps an assistant span, else 0.

    A zero-width token (offsets trimmed to nothing) is masked when it sits strictly inside a span.
    """
    if not len(offsets):
        return []
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    wide = starts < ends
    mask = np.zeros(len(bounds), dtype=bool)
    for span_start, span_end in spans:
        mask |= wide & (starts < span_end) & (ends > span_start)
        mask |= ~wide & (starts > span_start) & (starts < span_end)
    return mask.astype(np.int32).tolist()
