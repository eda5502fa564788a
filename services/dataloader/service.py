"""The dataloader gRPC service: servicer and serve().

Startup opens every dataset before health turns SERVING: each row is read and checked, so a
missing file, an unreadable parquet, a missing or mistyped column or a malformed row is found
at once. The service still starts when that fails: it logs the error, Describe reports it,
and every data RPC answers FAILED_PRECONDITION with it (file, row, problem), so the caller
sees why instead of a dead process.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rollway.common.config import ConfigError, from_dict, to_dict
from rollway.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from rollway.common.log import get_logger
from rollway.common.run_host import RunHost, run_scoped_servicer
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.structs import from_struct, to_struct
from rollway.dataloader.config import DataloaderConfig
from rollway.dataloader.datasets import DataError, OpenedSource, open_sources
from rollway.dataloader.encoder import Encoder, TokenizerError, load_tokenizer
from rollway.dataloader.eval_data import EvalSets
from rollway.dataloader.rows import RowRules
from rollway.dataloader.stream import DataStream, StreamSettings
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc

log = get_logger(__name__)

MAX_BATCH_SIZE = 1 << 20
DEFAULT_TIMEOUT_SECONDS = 600.0


# The calls whose progress the coordinator watches (a hang is told from a slow step by it).
WATCHED_CALLS = ("NextBatch", "EvalBatch", "GetState", "RestoreState")


class DataloaderService(dataloader_pb2_grpc.DataloaderServiceServicer):
    """Serves tokenised batches from the configured datasets."""

    def __init__(self, config: DataloaderConfig, max_message_mb: int = 64):
        self.config = config
        self.max_message_bytes = max_message_mb * 2**20
        self.mode = "sft" if config.is_sft else "rl"
        self.stream: DataStream | None = None
        self.eval_sets: EvalSets | None = None
        self.error: str | None = None
        self._opening = True
        self._cache_dir: Path | None = None
        self.vocab_size = 0

    def open(self) -> None:
        """Load the tokenizer and open every source; on failure keep the error to report it."""
        try:
            self._open()
        except (DataError, TokenizerError) as exc:
            self.error = str(exc)
            log.error("cannot serve the configured data", error=self.error)
        finally:
            self._opening = False

    def _open(self) -> None:
        config = self.config
        rules = RowRules(
            input_key=config.input_key,
            label_key=config.label_key,
            metadata_key=config.metadata_key,
            tool_key=config.tool_key,
            sft=config.is_sft,
            apply_chat_template=config.apply_chat_template,
        )
        try:
            if config.data_cache_dir:
                Path(config.data_cache_dir).mkdir(parents=True, exist_ok=True)
            self._cache_dir = Path(
                tempfile.mkdtemp(prefix="rollway-dataloader-", dir=config.data_cache_dir or None)
            )
        except OSError as exc:
            raise DataError(f"data_cache_dir: cannot create a directory there: {exc}") from None
        tokenizer = load_tokenizer(config.hf_checkpoint, config.chat_template_path)
        encoder = Encoder(tokenizer, config.is_sft, config.apply_chat_template)
        sources = open_sources(config.sources(), rules, self._cache_dir / "train", config.skip_bad_rows)
        try:
            eval_sources = open_sources(
                config.eval_sources(), rules, self._cache_dir / "eval", config.skip_bad_rows
            )
        except DataError as exc:
            for source in sources:
                source.close()
            raise DataError(f"eval_prompt_data: {exc}") from None
        self.vocab_size = len(tokenizer)
        self.eval_sets = EvalSets(eval_sources, encoder, config.rollout_max_prompt_len, config.skip_bad_rows)
        self.stream = DataStream(sources, encoder, self._settings())
        summary = [_source_summary(s) for s in sources + eval_sources]
        log.info("opened", mode=self.mode, sources=summary)

    def _settings(self) -> StreamSettings:
        config = self.config
        return StreamSettings(
            mode=self.mode,
            weights=list(config.prompt_data_weights) or None,
            seed=config.rollout_seed,
            shuffle=config.rollout_shuffle,
            num_epoch=config.num_epoch,
            max_len=config.rollout_max_prompt_len,
            skip_bad_rows=config.skip_bad_rows,
            prefetch_size=config.prefetch_size,
            max_message_bytes=self.max_message_bytes,
        )

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            for source in self.stream.sources:
                source.close()
        for source in self.eval_sets.sources if self.eval_sets is not None else []:
            source.close()
        if self._cache_dir is not None:
            shutil.rmtree(self._cache_dir, ignore_errors=True)

    def _ready(self) -> DataStream:
        if self._opening:
            raise Unavailable("the dataloader is still opening its datasets")
        if self.stream is None:
            raise FailedPrecondition(f"the dataloader cannot serve its data: {self.error}")
        return self.stream

    def NextBatch(self, request, context):
        """The next batch_size items; a retry of a batch_id returns the same batch."""
        stream = self._ready()
        if not 0 < request.batch_size <= MAX_BATCH_SIZE:
            raise InvalidArgument(
                "batch_size", f"must be in [1, {MAX_BATCH_SIZE}] (got {request.batch_size})"
            )
        remaining = context.time_remaining()
        # Leave a moment to answer before the caller's deadline: a late batch would be wasted.
        timeout = DEFAULT_TIMEOUT_SECONDS if remaining is None else max(remaining - 0.5, 0.0)
        return stream.next_batch(request.batch_id, request.batch_size, timeout)

    def GetState(self, request, context):
        """The committed cursor (JSON) and the number of batches served."""
        state_json, num_batches, epoch = self._ready().get_state()
        return dataloader_pb2.GetStateResponse(
            state_json=state_json, num_batches_served=num_batches, epoch=epoch
        )

    def RestoreState(self, request, context):
        """Continue from a GetState cursor."""
        stream = self._ready()
        if not request.state_json:
            raise InvalidArgument("state_json", "is empty; pass a state_json returned by GetState")
        return dataloader_pb2.RestoreStateResponse(epoch=stream.restore(request.state_json))

    def EvalBatch(self, request, context):
        """Items of one eval source from an offset (stateless)."""
        self._ready()
        if not 0 < request.batch_size <= MAX_BATCH_SIZE:
            raise InvalidArgument(
                "batch_size", f"must be in [1, {MAX_BATCH_SIZE}] (got {request.batch_size})"
            )
        assert self.eval_sets is not None
        return self.eval_sets.batch(request.name, request.offset, request.batch_size)

    def Describe(self, request, context):
        """Sources, mode, counters, effective configuration, and the error if the data cannot be served."""
        response = dataloader_pb2.DescribeResponse(mode=self.mode, error=self.error or "")
        if self.stream is not None:
            for source in self.stream.sources:
                response.sources.append(_source_info(source))
            response.counters.update(self.stream.counters())
            assert self.eval_sets is not None
            response.eval_sources.extend(_source_info(source) for source in self.eval_sets.sources)
            response.epoch = self.stream.epoch
            response.exhausted = self.stream.exhausted
        else:
            for spec in self.config.sources():
                response.sources.append(
                    dataloader_pb2.SourceInfo(
                        name=spec.name, path=spec.spec, weight=spec.weight, format=spec.format
                    )
                )
        response.config.CopyFrom(to_struct(to_dict(self.config)))
        return response


def _source_info(source: OpenedSource) -> dataloader_pb2.SourceInfo:
    spec = source.spec
    return dataloader_pb2.SourceInfo(
        name=spec.name,
        path=spec.spec,
        num_rows=source.num_rows,
        weight=spec.weight,
        format=spec.format,
        num_usable_rows=len(source.store),
        num_bad_rows=source.num_bad_rows,
    )


def _source_summary(source: OpenedSource) -> dict:
    return {"name": source.spec.name, "rows": source.num_rows, "usable": len(source.store)}


class DataloaderRuns:
    """Init and EndRun: which run the dataloader serves; each run gets its own stream."""

    def __init__(self, startup: DataloaderConfig, host: RunHost):
        self.startup = startup
        self.host = host

    def Init(self, request, context):
        try:
            settings = from_dict(DataloaderConfig, from_struct(request.config), base=self.startup)
        except ConfigError as exc:
            raise InvalidArgument(f"config.{exc.setting}", exc.problem) from None
        servicer, already, _ = self.host.init(request.run_id, settings, rebuild=request.rebuild)
        if servicer.error:
            self.host.end(request.run_id)
            raise FailedPrecondition(f"the dataloader cannot serve the run's data: {servicer.error}")
        return dataloader_pb2.InitResponse(
            run_id=request.run_id,
            already_initialized=already,
            settings=to_struct(to_dict(settings)),
            vocab_size=servicer.vocab_size,
        )

    def EndRun(self, request, context):
        return dataloader_pb2.EndRunResponse(was_holding=self.host.end(request.run_id))


def serve(server_config: ServerConfig, config: DataloaderConfig) -> None:
    """Open the datasets (when the flags name them), then serve until SIGTERM."""
    server = RollwayServer("dataloader", server_config, WATCHED_CALLS)

    def build(settings: DataloaderConfig) -> DataloaderService:
        servicer = DataloaderService(settings, server_config.max_message_mb)
        try:
            servicer.open()
        except BaseException:
            servicer.close()
            raise
        return servicer

    host = RunHost("dataloader", build, DataloaderService.close)
    server.add_service(
        dataloader_pb2_grpc.add_DataloaderServiceServicer_to_server,
        run_scoped_servicer(
            dataloader_pb2_grpc.DataloaderServiceServicer,
            dataloader_pb2.DESCRIPTOR.services_by_name["DataloaderService"],
            host,
            DataloaderRuns(config, host),
            read_only=frozenset({"Describe", "GetState", "EvalBatch"}),
        ),
        dataloader_pb2.DESCRIPTOR.services_by_name["DataloaderService"],
    )
    server.on_stop(host.close)
    server.start()
    if config.hf_checkpoint and config.prompt_data:
        host.adopt(build(config), config)
    server.set_serving()
    server.wait_for_termination()
