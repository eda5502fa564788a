"""The `hf` engine: in-process transformers generation with continuous batching.

The model is loaded with AutoModelForCausalLM.from_pretrained(--hf-checkpoint, --dtype) and run
by the Batcher (hf_batcher.py) on one thread. Releasing memory drops the weights; resuming
reloads them from --hf-checkpoint, which resets the served weight version to 0 (the weights are
the checkpoint's again): the coordinator pushes weights after ResumeMemory, as Miles does.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers import AutoConfig

from rollway.common.cpu_threads import apply_cpu_threads
from rollway.common.log import get_logger
from rollway.common.weights_checksum import dtype_from_name, weights_checksum
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import (
    BatchHandle,
    Engine,
    EngineStateError,
    ModelInfo,
    OnFinish,
    SampleRequest,
)
from rollway.rollout.engines.hf_batcher import Batcher
from rollway.rollout.engines.hf_weights import (
    eos_token_ids,
    load_model,
    load_named_tensors,
    load_tokenizer,
    loadable_tensors,
    resolve_device,
    swap_named_tensors,
)

log = get_logger("rollway.rollout.hf")


class HFEngine(Engine):
    """transformers model + tokenizer served in process."""

    name = "hf"

    def __init__(self, config: RolloutConfig):
        super().__init__()
        self.config = config
        self.device = resolve_device(config.device)
        if self.device.type == "cpu":
            apply_cpu_threads(config.cpu_threads)
        self.dtype = dtype_from_name(config.dtype)
        self._batcher: Batcher | None = None
        self._info: ModelInfo | None = None

    @property
    def model_info(self) -> ModelInfo:
        assert self._info is not None, "engine not started"
        return self._info

    @property
    def batcher(self) -> Batcher:
        assert self._batcher is not None, "engine not started"
        return self._batcher

    def start(self) -> None:
        path = self.config.hf_checkpoint
        tokenizer = load_tokenizer(path)
        model = self._load_model()
        model_config = AutoConfig.from_pretrained(path)
        max_context = self.config.rollout_max_context_len or int(model_config.max_position_embeddings)
        self._info = ModelInfo(
            model=path,
            vocab_size=int(model.get_input_embeddings().weight.shape[0]),
            max_context_len=max_context,
            eos_token_ids=eos_token_ids(path, tokenizer),
            dtype=str(self.dtype).removeprefix("torch."),
        )
        self._batcher = Batcher(
            model,
            tokenizer,
            self._info.eos_token_ids,
            max_rows=self.config.max_running_requests,
            static=self.config.hf_batching == "static",
            weight_version=lambda: self.weight_version,
        )
        self._batcher.start()
        log.info(
            "hf engine ready",
            model=path,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            batching=self.config.hf_batching,
            eos_token_ids=sorted(self._info.eos_token_ids),
        )

    def _load_model(self) -> torch.nn.Module:
        return load_model(
            self.config.hf_checkpoint, self.config.dtype, self.device, self.config.attn_implementation
        )

    def stop(self) -> None:
        if self._batcher is not None:
            self._batcher.stop()

    # --- generation ---

    def submit(self, requests: list[SampleRequest], on_finish: OnFinish) -> BatchHandle:
        if self.weights_released:
            raise EngineStateError("engine weights are released (ReleaseMemory); call ResumeMemory first")
        handle = BatchHandle(len(requests), on_finish)
        self.batcher.submit(requests, handle)
        return handle

    def abort(self, handle: BatchHandle) -> int:
        return self.batcher.abort(handle)

    def abort_all(self) -> int:
        return self.batcher.abort_all()

    @property
    def idle(self) -> bool:
        return self.batcher.idle

    @property
    def num_in_flight(self) -> int:
        return self.batcher.num_in_flight

    @property
    def running(self) -> bool:
        return self._batcher is not None and self._batcher.running

    # --- memory ---

    @property
    def weights_released(self) -> bool:
        return self.batcher.model is None

    def release_memory(self, tags: list[str]) -> None:
        # kv_cache and cuda_graph: the hf engine keeps no KV cache between batches and no graphs.
        if "weights" not in tags or self.weights_released:
            return
        if not self.batcher.idle:
            raise EngineStateError("generation is in flight; Pause (abort or wait) before ReleaseMemory")
        with self.batcher.model_lock:
            self.batcher.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log.info("weights released")

    def resume_memory(self, tags: list[str]) -> None:
        if "weights" not in tags or not self.weights_released:
            return
        model = self._load_model()
        with self.batcher.model_lock:
            self.batcher.model = model
        self.weight_version = 0
        log.info("weights reloaded from checkpoint", model=self.config.hf_checkpoint, weight_version=0)

    def reset_weights(self) -> None:
        # Drop the served model first: loading beside it would hold two models at the peak, and
        # the allocator keeps such a peak in the service's RSS (common/freed_memory.py).
        with self.batcher.model_lock:
            self.batcher.model = None
        model = self._load_model()
        with self.batcher.model_lock:
            self.batcher.model = model
        self.weight_version = 0
        log.info("base weights reloaded", model=self.config.hf_checkpoint, weight_version=0)

    # --- weight hooks ---

    def _model(self) -> torch.nn.Module:
        model = self.batcher.model
        if model is None:
            raise EngineStateError("engine weights are released (ReleaseMemory); call ResumeMemory first")
        return model

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        with self.batcher.model_lock:
            return load_named_tensors(self._model(), named_tensors)

    def swap_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        with self.batcher.model_lock:
            return swap_named_tensors(self._model(), named_tensors)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return loadable_tensors(self._model())

    def prompt_log_probs(self, token_ids: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([token_ids], device=self.device)
        with self.batcher.model_lock, torch.no_grad():
            logits = self._model()(input_ids=ids).logits[0, :-1].float()
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

    def scramble_weights(self, seed: int) -> int:
        generator = torch.Generator(device=self.device).manual_seed(seed)
        with self.batcher.model_lock, torch.no_grad():
            params = list(self._model().parameters())
            for param in params:
                param.normal_(generator=generator)
        return len(params)

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._model().named_parameters()

    def weights_checksum(self, dtype: torch.dtype | None = None) -> tuple[str, int]:
        with self.batcher.model_lock:
            return weights_checksum(self._model().named_parameters(), dtype or self.dtype)

    def describe(self) -> dict[str, Any]:
        return {"num_forwards": self.batcher.num_forwards, "weights_released": self.weights_released}
