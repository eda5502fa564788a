"""exact_match and f1 rewards on the response text.

exact_match, the rule (written for the demo task, two-digit addition, label = digits of the sum):
  1. The candidate is the content of the last \\boxed{...} in the response if there is one,
     otherwise the whole response.
  2. If the label is a number, the candidate's last number is compared with it numerically
     (numbers: optional sign, digits with optional thousands commas, optional decimals; a full
     stop that ends the sentence is not a decimal point). "The answer is 82." and
     "40 + 42 = 82" match 82; "8 2" and "The answer is 82, not 83" do not.
  3. Otherwise the normalised candidate must equal the normalised label (case-folded,
     whitespace collapsed, trailing full stop removed).
f1: SQuAD's token F1 between the response and the label (lower-case, punctuation and articles
removed, whitespace tokens).
"""

from __future__ import annotations

import collections
import re
import string
from decimal import Decimal, InvalidOperation

from rollway.rollout.rewards.types import RewardSample

NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?")
BOXED = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(BOXED)
    for pos in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[pos], 0)
        if depth == 0:
            return text[begin:pos]
    return None


def parse_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        return None


def final_number(text: str) -> Decimal | None:
    """The last number in `text` (see the module doc), or None."""
    matches = NUMBER.findall(text)
    return parse_number(matches[-1]) if matches else None


def _normalise(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".").strip()


def require_label(sample: RewardSample) -> None:
    """A reward that compares the response with the label does not score an unlabelled prompt:
    against "" a blank response would match (reward 1). The sample gets reward 0 and this error
    (reward_error), and the service counts it (num_reward_errors)."""
    if not sample.label.strip():
        raise ValueError(
            "the prompt has no label: not scored (reward 0); give the data a label_key or use reward none"
        )


def exact_match(sample: RewardSample) -> float:
    require_label(sample)
    candidate = last_boxed(sample.response)
    candidate = sample.response if candidate is None else candidate
    label_number = parse_number(sample.label)
    if label_number is not None and label_number.is_finite():
        return float(final_number(candidate) == label_number)
    return float(_normalise(candidate) == _normalise(sample.label))


def _f1_tokens(text: str) -> list[str]:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return text.split()


def f1(sample: RewardSample) -> float:
    require_label(sample)
    prediction, truth = _f1_tokens(sample.response), _f1_tokens(sample.label)
    common = collections.Counter(prediction) & collections.Counter(truth)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction), overlap / len(truth)
    return 2 * precision * recall / (precision + recall)
