"""The coordinator's view of the other services: typed calls over their gRPC stubs.

Only the generated protos and rollway.common are imported; nothing of the other services' code.
Large batches go to the trainer as a header plus chunks of samples so that no message nears the
size limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from rollway.common.client import ClientConfig, RetryingStream, open_channel, wait_until_serving
from rollway.common.structs import to_struct
from rollway.common.tracing import in_current_context
from rollway.common.v1 import common_pb2
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

SAMPLES_PER_CHUNK = 64
# Generation and training calls may run for a long time; everything else uses the client default.
LONG_CALL_SECONDS = 3600.0
CONTROL_CALL_SECONDS = 30.0


@dataclass
class Services:
    """Channels and stubs to the services a run uses (any may be absent in a debug mode)."""

    dataloader: dataloader_pb2_grpc.DataloaderServiceStub | None = None
    trainer: trainer_pb2_grpc.TrainerServiceStub | None = None
    rollouts: list[rollout_pb2_grpc.RolloutServiceStub] = field(default_factory=list)
    addresses: dict[str, list[str]] = field(default_factory=dict)
    _channels: list[grpc.Channel] = field(default_factory=list)
    _channel_of: dict[tuple[str, int], grpc.Channel] = field(default_factory=dict)  # (name, index)
    gone: set[tuple[str, int]] = field(default_factory=set)  # dead or hung: its channel is closed
    # Long calls in flight (Generate streams, TrainStep, ComputeLogProbs): cancel_all() ends them.
    _calls: set = field(default_factory=set)
    _calls_lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False
    _stopped: threading.Event = field(default_factory=threading.Event)  # ends the channels' retries

    @classmethod
    def connect(
        cls,
        *,
        dataloader: str = "",
        trainer: str = "",
        rollouts: Sequence[str] = (),
        client_config: ClientConfig | None = None,
        wait_seconds: float = 120.0,
    ) -> Services:
        services = cls(
            addresses={
                "dataloader": [dataloader] if dataloader else [],
                "trainer": [trainer] if trainer else [],
                "rollout": list(rollouts),
            }
        )
        for address in [dataloader, trainer, *rollouts]:
            if address:
                wait_until_serving(address, wait_seconds, client_config)
        if dataloader:
            services.dataloader = dataloader_pb2_grpc.DataloaderServiceStub(
                services._open(("dataloader", 0), dataloader, client_config)
            )
        if trainer:
            services.trainer = trainer_pb2_grpc.TrainerServiceStub(
                services._open(("trainer", 0), trainer, client_config)
            )
        services.rollouts = [
            rollout_pb2_grpc.RolloutServiceStub(services._open(("rollout", i), a, client_config))
            for i, a in enumerate(rollouts)
        ]
        return services

    def _open(
        self, service: tuple[str, int], address: str, client_config: ClientConfig | None
    ) -> grpc.Channel:
        channel = open_channel(address, client_config, stop=self._stopped)
        self._channels.append(channel)
        self._channel_of[service] = channel
        return channel

    def stub(self, name: str, index: int = 0):
        """The stub of instance `index` of service `name` (trainer, dataloader, rollout)."""
        if name == "rollout":
            return self.rollouts[index]
        return {"trainer": self.trainer, "dataloader": self.dataloader}[name]

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def cancel_all(self, dead: tuple[str, int] | None = None) -> None:
        """Cancel every long call in flight, and every later one (StopRun immediate, a dead service).

        `dead` (name, index): a dead or hung service; its channel is closed, which ends every call
        to it at once, short ones included (a frozen service would hold each to its deadline)."""
        with self._calls_lock:
            self.cancelled = True
            calls = list(self._calls)
        self._stopped.set()
        for call in calls:
            call.cancel()
        if dead is not None and dead in self._channel_of:
            self.gone.add(dead)
            self._channel_of[dead].close()

    def track(self, call):
        with self._calls_lock:
            self._calls.add(call)
            if self.cancelled:
                call.cancel()
        return call

    def untrack(self, call) -> None:
        with self._calls_lock:
            self._calls.discard(call)

    # --- dataloader ---
    def next_batch(self, batch_size: int, batch_id: int) -> dataloader_pb2.NextBatchResponse:
        return self.dataloader.NextBatch(
            dataloader_pb2.NextBatchRequest(batch_size=batch_size, batch_id=batch_id)
        )

    # --- rollout ---
    def generate(
        self,
        prompts: Sequence[rollout_pb2.Prompt],
        n_samples_per_prompt: int,
        sampling: common_pb2.SamplingParams,
        reward: str,
        request_id: str,
        enough: Callable[[common_pb2.Sample], bool] | None = None,
        keep_aborted: bool = False,
    ) -> list[common_pb2.Sample]:
        """Spread prompt groups over the rollout services, collect every sample (any arrival order).

        `enough` sees each sample as it arrives (from several threads); once it returns True the
        rollout services abort the samples still generating. By default the calls are cancelled and
        only the samples received so far come back; with `keep_aborted` each service is sent
        Abort(request_id) and the aborted samples stream back too, with their partial responses."""
        # Contiguous shards, one per service. Each service numbers the samples of its shard from
        # 0 and seeds sample i with seed + i: shard s, which starts at prompt `starts[s]`, gets
        # seed + starts[s] * n, and its samples' indices are shifted by as much, so every sample
        # has its index in the whole request and the seed a single service would have given it.
        num_shards = max(len(self.rollouts), 1)
        size, extra = divmod(len(prompts), num_shards)
        starts = [s * size + min(s, extra) for s in range(num_shards + 1)]
        shards = [list(prompts[starts[s] : starts[s + 1]]) for s in range(len(self.rollouts))]
        calls: list = []  # the streaming calls started so far (cancel() stops one)
        stopped = threading.Event()
        lock = threading.Lock()

        def stop_all() -> None:
            with lock:
                if stopped.is_set():
                    return
                stopped.set()
                if not keep_aborted:
                    for call in calls:
                        call.cancel()
            if keep_aborted:
                for stub in self.rollouts:
                    stub.Abort(rollout_pb2.AbortRequest(request_id=request_id), timeout=CONTROL_CALL_SECONDS)

        def run(
            stub: rollout_pb2_grpc.RolloutServiceStub,
            shard: list[rollout_pb2.Prompt],
            start: int,
        ) -> list[common_pb2.Sample]:
            if not shard:
                return []
            first_index = start * n_samples_per_prompt
            request = rollout_pb2.GenerateRequest(
                prompts=shard,
                n_samples_per_prompt=n_samples_per_prompt,
                sampling_params=sampling,
                reward=reward,
                request_id=request_id,
            )
            if sampling.HasField("seed"):
                request.sampling_params.seed = sampling.seed + first_index
            # A busy rollout service (its Generate queue full) refuses before the first sample: retried.
            call = self.track(RetryingStream(lambda: stub.Generate(request, timeout=LONG_CALL_SECONDS)))
            with lock:
                calls.append(call)
                if stopped.is_set() and not keep_aborted:
                    call.cancel()
            samples = []
            try:
                for reply in call:
                    reply.sample.index += first_index
                    samples.append(reply.sample)
                    if enough is not None and enough(reply.sample):
                        stop_all()
            except grpc.RpcError as exc:
                if self.cancelled or not (stopped.is_set() and exc.code() == grpc.StatusCode.CANCELLED):
                    raise
            finally:
                self.untrack(call)
            return samples

        with ThreadPoolExecutor(max(len(self.rollouts), 1)) as pool:
            results = list(pool.map(in_current_context(run), self.rollouts, shards, starts))
        return sorted((s for shard in results for s in shard), key=lambda s: (s.group_index, s.index))

    def rollout_info(self) -> list[rollout_pb2.GetInfoResponse]:
        return [stub.GetInfo(rollout_pb2.GetInfoRequest()) for stub in self.rollouts]

    # --- trainer ---
    def train_step(
        self, step_id: int, samples: Sequence[common_pb2.Sample], overrides: dict | None = None
    ) -> trainer_pb2.TrainStepResponse:
        header = trainer_pb2.TrainStepHeader(
            step_id=step_id, num_samples=len(samples), overrides=to_struct(overrides or {})
        )
        call = self.track(
            self.trainer.TrainStep.future(
                _header_then_chunks(header, samples, trainer_pb2.TrainStepRequest), timeout=LONG_CALL_SECONDS
            )
        )
        try:
            return call.result()
        finally:
            self.untrack(call)

    def compute_log_probs(
        self, samples: Sequence[common_pb2.Sample], temperature: float, use_reference: bool = False
    ) -> list[list[float]]:
        header = trainer_pb2.ComputeLogProbsHeader(temperature=temperature, use_reference=use_reference)
        replies = self.track(
            self.trainer.ComputeLogProbs(
                _header_then_chunks(header, samples, trainer_pb2.ComputeLogProbsRequest),
                timeout=LONG_CALL_SECONDS,
            )
        )
        try:
            results = sorted((r for reply in replies for r in reply.results), key=lambda r: r.index)
        finally:
            self.untrack(replies)
        return [list(r.log_probs) for r in results]


def _header_then_chunks(header, samples: Sequence[common_pb2.Sample], request_cls) -> Iterator:
    yield request_cls(header=header)
    for start in range(0, len(samples), SAMPLES_PER_CHUNK):
        yield request_cls(samples=trainer_pb2.SampleChunk(samples=samples[start : start + SAMPLES_PER_CHUNK]))
