"""Settings of the dataloader service (flags are generated from the fields; Miles' names).

Settings the coordinator declares too (hf_checkpoint, loss_type, num_epoch, rollout_seed,
eval_prompt_data) have the same type and default here, so one flat run config reaches both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollway.common import shared_settings
from rollway.common.config import ConfigError, setting
from rollway.dataloader.sources import SourceSpec, SourceSpecError, parse_sources

LossType = Literal["sft_loss", "policy_loss"]


@dataclass
class DataloaderConfig:
    """Datasets, tokenisation, chat templates, order and prefetch of the dataloader."""

    hf_checkpoint: str = shared_settings.hf_checkpoint()
    prompt_data: list[str] = setting(
        [], "a jsonl/parquet path, or name path pairs; path@[start:end] slices rows"
    )
    prompt_data_weights: list[float] = setting(
        [],
        "sampling weight per --prompt-data source, each source cycling through its own epochs "
        "(empty: every row of every source once per epoch)",
    )
    eval_prompt_data: list[str] = shared_settings.eval_prompt_data()
    input_key: str = setting(
        "input", "column with the prompt (a string) or the conversation (a list of messages)", min_length=1
    )
    label_key: str = setting("", "column with the label (empty: no label)")
    metadata_key: str = setting("metadata", "column with per-row metadata (a mapping; absent column: {})")
    tool_key: str = setting("", "column with the tools passed to the chat template (empty: none)")
    apply_chat_template: bool = setting(
        False, "render prompts/conversations with the tokenizer's chat template"
    )
    chat_template_path: str = shared_settings.chat_template_path()
    mode: Literal["auto", "rl", "sft"] = setting(
        "auto", "rl: prompt items; sft: conversations with loss masks; auto: sft when loss_type is sft_loss"
    )
    loss_type: LossType = shared_settings.loss_type()
    rollout_shuffle: bool = setting(
        False, "shuffle the rows each epoch (seeded by rollout_seed and the epoch)"
    )
    rollout_seed: int = shared_settings.rollout_seed()
    num_epoch: int = shared_settings.num_epoch()
    rollout_max_prompt_len: int = setting(
        0,
        "drop (and count) items with more tokens: RL prompts, SFT whole conversations (0: no limit)",
        minimum=0,
    )
    prefetch_size: int = setting(
        256, "items tokenised ahead in the background (0: tokenise on request)", minimum=0
    )
    skip_bad_rows: bool = setting(
        False, "skip and count bad rows instead of failing with an error naming them"
    )
    data_cache_dir: str = setting(
        "", "disk directory for the checked rows (~1 KB per conversation; default: the system temp dir)"
    )

    @property
    def is_sft(self) -> bool:
        """Whether items are SFT conversations (with loss masks) rather than RL prompts."""
        return self.mode == "sft" or (self.mode == "auto" and self.loss_type == "sft_loss")

    def sources(self) -> list[SourceSpec]:
        """The --prompt-data sources, parsed (validate() has checked they parse)."""
        return parse_sources(self.prompt_data, self.prompt_data_weights)

    def eval_sources(self) -> list[SourceSpec]:
        """The --eval-prompt-data sources (name path pairs), parsed."""
        if not self.eval_prompt_data:
            return []
        if len(self.eval_prompt_data) % 2:
            raise SourceSpecError("expects name path pairs")
        return parse_sources(self.eval_prompt_data)

    def check_required(self) -> None:
        """What a run cannot go without (a dataloader started bare gets them from its run)."""
        if not self.hf_checkpoint:
            raise ConfigError(
                "hf_checkpoint", "is required: the dataloader tokenises with the model's tokenizer"
            )
        if not self.prompt_data:
            raise ConfigError("prompt_data", "is required: give a jsonl/parquet path or name path pairs")

    def validate(self) -> None:
        parsers = (("prompt_data", self.sources), ("eval_prompt_data", self.eval_sources))
        for name, parse in parsers[0 if self.prompt_data else 1 :]:
            try:
                parse()
            except SourceSpecError as exc:
                setting_name = "prompt_data_weights" if "weight" in str(exc) else name
                raise ConfigError(setting_name, str(exc)) from None
        if self.is_sft and not self.apply_chat_template:
            raise ConfigError("apply_chat_template", "SFT needs it: loss masks come from the chat template")
        if self.chat_template_path and not self.apply_chat_template:
            raise ConfigError("chat_template_path", "has no effect without --apply-chat-template")
