"""What every inference engine provides, and the requests and results it exchanges.

An engine generates samples asynchronously: `submit` queues a batch of SampleRequests and
returns at once; each finished sample is handed to the batch's `on_finish` callback (from an
engine thread, so the callback must only hand it over, e.g. put it on a queue). The service
owns pausing, rewards and streaming; the engine owns the model and the decoding.

Weight hooks (`load_weights`, `swap_weights`, `weight_tensors`, `named_parameters`,
`weights_checksum`, `scramble_weights`, `weight_version`) are what the weight-sync receiver
(weight_sync/receiver.py) builds on; engines that cannot offer one raise EngineUnsupported.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollway.rollout.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


class EngineError(RuntimeError):
    """The engine failed to serve a request. `retryable`: a transient failure (server restarting)."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class EngineUnsupported(EngineError):
    """The engine cannot do this (e.g. read back weights from an SGLang server)."""


class EngineStateError(EngineError):
    """The engine is not in a state to do this (e.g. generate with its weights released)."""


class WeightLoadError(EngineError):
    """A named tensor set does not fit the served model (unknown name, wrong shape or dtype)."""


@dataclass(frozen=True)
class SampleRequest:
    """One sample to generate. `prompt_key` is equal for samples of the same prompt (prefill sharing)."""

    index: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    prompt_key: int = 0
    # A multi-turn episode (rollway.rollout.episode_spec.EpisodeSpec): run by the EpisodeEngine, which
    # hands the engine one plain request per model turn. None: a single-turn sample.
    episode: Any = None


@dataclass
class SampleResult:
    """A finished (or aborted) sample. `error` is set when the engine failed it."""

    request: SampleRequest
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = FINISH_ABORT
    text: str = ""
    weight_version: int = 0
    error: str = ""
    retryable: bool = False
    # A finished episode (rollway.rollout.episode_spec.EpisodeOutcome): loss mask, turns, reward.
    # token_ids, log_probs and text then cover the whole episode, resumed prefix included.
    episode: Any = None


OnFinish = Callable[[SampleResult], None]


class BatchHandle:
    """Tracks one submitted batch: how many of its samples are still unfinished."""

    def __init__(self, num_samples: int, on_finish: OnFinish):
        self.num_pending = num_samples
        self.on_finish = on_finish
        self.aborted = False
        self._lock = threading.Lock()

    def finish(self, result: SampleResult) -> None:
        with self._lock:
            self.num_pending -= 1
        self.on_finish(result)

    @property
    def done(self) -> bool:
        return self.num_pending <= 0


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about the served model that request validation needs."""

    model: str
    vocab_size: int
    max_context_len: int
    eos_token_ids: frozenset[int]
    dtype: str


class Engine(ABC):
    """An inference engine: generation, pause/abort, memory release, weight hooks."""

    name = "base"
    # True: the rollout service process joins the weight group and loads tensors through the hooks
    # below; False: the engine's own workers join it (sglang's HTTP weight endpoints).
    receives_weights_in_process = True

    def __init__(self) -> None:
        self.weight_version = 0

    @property
    @abstractmethod
    def model_info(self) -> ModelInfo: ...

    @property
    def num_workers(self) -> int:
        """Engine workers (ranks in the weight group)."""
        return 1

    @abstractmethod
    def start(self) -> None:
        """Load or launch the model; return once it can generate."""

    @abstractmethod
    def stop(self) -> None:
        """Abort everything and free the model (servers, threads)."""

    @abstractmethod
    def submit(self, requests: list[SampleRequest], on_finish: OnFinish) -> BatchHandle:
        """Queue `requests`; each result goes to `on_finish` once its sample ends."""

    @abstractmethod
    def abort(self, handle: BatchHandle) -> int:
        """End the batch's unfinished samples with FINISH_ABORT; return how many were aborted."""

    @abstractmethod
    def abort_all(self) -> int:
        """Abort every unfinished sample of every batch; return how many were aborted."""

    def pause(self) -> None:
        """Stop scheduling work (after abort_all, or once idle); default: nothing to do."""
        return None

    def resume(self) -> None:
        """Undo `pause`."""
        return None

    @abstractmethod
    def release_memory(self, tags: list[str]) -> None:
        """Free memory by tag (see MEMORY_TAGS); the engine must be idle."""

    @abstractmethod
    def resume_memory(self, tags: list[str]) -> None:
        """Re-acquire memory freed by release_memory."""

    def reset_weights(self) -> None:
        """Serve the base weights of hf_checkpoint again, at weight version 0 (a new run starts
        from them on a reused engine)."""
        raise EngineError(f"the {self.name} engine cannot reload its base weights")

    @property
    def weights_released(self) -> bool:
        return False

    @property
    def num_in_flight(self) -> int:
        """Samples queued or being generated."""
        return 0

    @property
    def weight_sync_backend(self) -> str:
        """The torch.distributed backend this engine's workers receive weights on."""
        return "gloo"

    @property
    def num_workers_awaiting_weights(self) -> int:
        """Workers restarted since the last weight update; they serve nothing until the next one."""
        return 0

    @property
    def running(self) -> bool:
        """False once the engine will finish no more samples (stopped, or its loop died)."""
        return True

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy named tensors into the served weights in place; return how many were loaded."""
        raise EngineUnsupported(f"the {self.name} engine cannot load weights in process")

    def swap_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Make the named tensors the served weights without copying (the engine keeps them);
        all names, shapes and dtypes are checked before anything changes. Default: load_weights."""
        return self.load_weights(named_tensors)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor a weight update may replace, by Hugging Face name (tied aliases included);
        for checking a manifest, not for writing."""
        raise EngineUnsupported(f"the {self.name} engine cannot list its weights")

    def prompt_log_probs(self, token_ids: list[int], temperature: float) -> list[float]:
        """log p(token_i | tokens before it) for i >= 1 with the served weights, logits divided by
        `temperature` (0: greedy, unscaled) and log-softmaxed in fp32 as sampled tokens are."""
        raise EngineUnsupported(f"the {self.name} engine cannot score prompt tokens")

    def scramble_weights(self, seed: int) -> int:
        """Debug hook (--check-weight-update-equal): overwrite every served weight with random
        values in place, keeping the weight version; return how many tensors changed."""
        raise EngineUnsupported(f"the {self.name} engine cannot scramble its weights")

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served weights, by Hugging Face name (tied weights once)."""
        raise EngineUnsupported(f"the {self.name} engine cannot read its weights back")

    # What weights_checksum computes: rollway.common.weights_checksum's sha256, comparable with the
    # trainer's; an engine that can only hash in its own format names that format here.
    checksum_algorithm = "sha256"

    def weights_checksum(self, dtype: torch.dtype | None = None) -> tuple[str, int]:
        """rollway.common.weights_checksum over named_parameters() cast to `dtype` (default: served)."""
        raise EngineUnsupported(f"the {self.name} engine cannot checksum its weights")

    def describe(self) -> dict[str, Any]:
        """Counters and state for logs and GetInfo."""
        return {}
