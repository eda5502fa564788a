"""Settings of the rollout service (flags are generated from the fields).

Names follow Miles (`--hf-checkpoint`, `--rollout-temperature`, `--n-samples-per-prompt`,
`--rollout-max-response-len`, `--custom-rm-path`, `--rm-url`, `--group-rm`, ...). Sampling settings
are the defaults of a Generate call; a request's own sampling parameters override them.

This module does not import torch, so `--help` and configuration errors are instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollway.common import shared_settings
from rollway.common.config import KEY_EQUALS_VALUE, MODULE_ATTR_OR_EMPTY, ConfigError, setting
from rollway.rollout.environments import ENVIRONMENTS, check_environment_settings

# Engine names; the registry in engines/__init__.py maps each to its implementation.
ENGINE_NAMES = ("hf", "sglang")
# Settings of the rollout process, shared by every run it serves (its Generate queue is built
# once at start-up): only its start-up flags set them; a run that gives one is refused (runs.py,
# and the coordinator's run config) rather than silently ignored.
PROCESS_SETTINGS = frozenset({"max_generate_calls", "generate_queue_size", "generate_queue_timeout"})


def process_setting_problem(name: str) -> str:
    """Why a run may not set `name` (one of PROCESS_SETTINGS), naming the flag to use instead."""
    flag = "--" + name.replace("_", "-")
    return (
        f"is a setting of the rollout service process (its Generate queue, shared by every run), "
        f"not of a run: start the rollout service with {flag}"
    )


# Settings of the engine itself: a run that changes one gets a new engine (runs.py); the other
# settings are defaults of requests and rewards, per run.
ENGINE_SETTINGS = frozenset(
    {
        "rollout_engine",
        "hf_checkpoint",
        "dtype",
        "device",
        "attn_implementation",
        "hf_batching",
        "max_running_requests",
        "rollout_max_context_len",
        "sglang_urls",
        "rollout_num_gpus",
        "rollout_num_gpus_per_engine",
        "sglang_mem_fraction_static",
        "sglang_port",
        "sglang_host",
        "sglang_log_dir",
        "sglang_enable_memory_saver",
        "sglang_extra_args",
        "sglang_python",
        "sglang_env",
        "sglang_startup_timeout",
        "sglang_request_timeout",
        "sglang_health_interval",
        "sglang_max_restarts",
        "sglang_server_concurrency",
    }
)
# Environments of multi-turn episodes (environments/__init__.py's table); "none": single turn.
ENVIRONMENT_NAMES = tuple(ENVIRONMENTS)
TOOL_CALL_PARSERS = ("qwen3", "qwen25")  # both: <tool_call>{"name": ..., "arguments": {...}}</tool_call>


@dataclass
class RolloutConfig:
    """Rollout settings: engine, model, sampling defaults, rewards, limits."""

    # --- engine and model ---
    rollout_engine: str = setting(
        "hf", "inference engine: hf (in-process, CPU or GPU) or sglang", choices=ENGINE_NAMES
    )
    hf_checkpoint: str = shared_settings.hf_checkpoint()
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = shared_settings.dtype()
    device: str = setting("auto", "hf engine: torch device (auto: cuda if available, else cpu)")
    cpu_threads: int = shared_settings.cpu_threads()
    attn_implementation: Literal["eager", "sdpa"] = shared_settings.attn_implementation()
    hf_batching: Literal["continuous", "static"] = setting(
        "continuous",
        "hf engine: continuous (samples join as others finish) or static (whole batches) batching",
    )
    max_running_requests: int = setting(
        256, "hf engine: most samples decoded together in one batch", exclusive_minimum=0
    )
    rollout_max_context_len: int = setting(
        0, "longest prompt + response accepted; 0: the model's max_position_embeddings", minimum=0
    )
    max_samples_per_request: int = setting(
        4096,
        "most samples (prompts x n_samples_per_prompt) one Generate may ask for (RESOURCE_EXHAUSTED)",
        exclusive_minimum=0,
    )
    max_generate_calls: int = setting(
        0, "Generate calls generating at once; more wait in the queue (0: --max-workers minus 4)", minimum=0
    )
    generate_queue_size: int = setting(
        256,
        "Generate calls that may wait for a running slot; one more is refused (RESOURCE_EXHAUSTED)",
        minimum=0,
    )
    generate_queue_timeout: float = setting(
        600.0,
        "seconds a queued Generate call may wait for a running slot (then DEADLINE_EXCEEDED)",
        exclusive_minimum=0,
    )
    # --- prompts given as text or chat messages ---
    chat_template_path: str = shared_settings.chat_template_path()
    # --- sampling defaults (a request's sampling_params override them) ---
    n_samples_per_prompt: int = shared_settings.n_samples_per_prompt()
    rollout_temperature: float = shared_settings.rollout_temperature()
    rollout_top_p: float = shared_settings.rollout_top_p()
    rollout_top_k: int = shared_settings.rollout_top_k()
    rollout_max_response_len: int = shared_settings.rollout_max_response_len()
    rollout_stop: list[str] = shared_settings.rollout_stop()
    rollout_stop_token_ids: list[int] = setting([], "token ids that end a response, besides the EOS ids")
    sampling_seed: int | None = setting(
        None, "base sampling seed when a request sets none: sample i uses seed + i; unset: unseeded"
    )
    # --- rewards ---
    reward: str = setting("exact_match", "reward function used when a request names none ('none': no reward)")
    rm_url: str = setting("", "URL of a remote reward model (registers the 'remote' reward)")
    custom_rm_path: str = setting(
        "", "module:function of a custom reward (registers the 'custom' reward)", pattern=MODULE_ATTR_OR_EMPTY
    )
    group_rm: bool = setting(False, "the custom reward scores a whole group: f(samples) -> list of rewards")
    reward_timeout: float = setting(
        30.0, "seconds one reward call may take before the sample is marked", exclusive_minimum=0
    )
    num_reward_workers: int = setting(8, "threads computing rewards concurrently", exclusive_minimum=0)
    # --- multi-turn episodes (environments/, episodes.py) ---
    environment: str = setting(
        "none",
        "environment that runs each sample as a multi-turn episode: none (single turn), calculator, "
        "remote (--environment-url), custom (--custom-generate-function-path), verifiers "
        "(--verifiers-taskset), openenv (--openenv-url) or agent (--agent-function-path, "
        "through the OpenAI-compatible endpoint)",
        choices=ENVIRONMENT_NAMES,
    )
    environment_url: str = setting("", "host:port of an Environment gRPC service (--environment remote)")
    openenv_url: str = setting(
        "", "http://host:port of an OpenEnv environment server (--environment openenv)"
    )
    openenv_turns: str = setting(
        "",
        "module:attr of an OpenEnvTurns (environments/openenv.py): the model's turn as the OpenEnv "
        "Action, its StepResult as the text appended (default: both a `message` string field)",
        pattern=MODULE_ATTR_OR_EMPTY,
    )
    custom_generate_function_path: str = setting(
        "",
        "module:attr of an Environment class (or factory) run for each sample (--environment custom)",
        pattern=MODULE_ATTR_OR_EMPTY,
    )
    verifiers_taskset: str = setting(
        "",
        "module:attr of a verifiers Taskset, Env or a function returning one (--environment verifiers; "
        "PyPI verifiers==0.4.0)",
        pattern=MODULE_ATTR_OR_EMPTY,
    )
    generate_max_turns: int = setting(
        16, "most model turns of an episode (then FINISH_REASON_MAX_TURNS)", exclusive_minimum=0
    )
    generate_max_total_tokens: int = setting(
        0, "most response tokens of an episode, model and environment (0: the model context)", minimum=0
    )
    generate_turn_timeout: float = setting(
        300.0, "seconds one model turn may take (then TURN_TIMEOUT)", exclusive_minimum=0
    )
    generate_episode_timeout: float = setting(
        1800.0, "seconds one episode may take (then EPISODE_TIMEOUT)", exclusive_minimum=0
    )
    environment_step_timeout: float = setting(
        60.0,
        "seconds one call to a remote or verifiers environment may take (then the sample FAILED)",
        exclusive_minimum=0,
    )
    generate_tool_call_parser: str = setting(
        "qwen3",
        "format of tool calls in the model's turns (Qwen3's <tool_call> JSON)",
        choices=TOOL_CALL_PARSERS,
    )
    num_environment_workers: int = setting(
        16,
        "threads stepping environments concurrently (an agent episode holds one while it runs)",
        exclusive_minimum=0,
    )
    # --- agents against the OpenAI-compatible endpoint (openai_api/, --environment agent) ---
    agent_function_path: str = setting(
        "",
        "module:attr of the agent run once per sample with its episode's OpenAI base_url",
        pattern=MODULE_ATTR_OR_EMPTY,
    )
    agent_request_timeout: float = setting(
        300.0,
        "seconds an agent episode waits for the agent's next request (then the sample FAILED)",
        exclusive_minimum=0,
    )
    openai_api_port: int = setting(
        0,
        "port of the OpenAI-compatible HTTP endpoint on the service's host; 0: a free port, served "
        "from the first agent episode on; a port: served from the start, plain /v1 requests too",
        minimum=0,
        maximum=65535,
    )
    # --- sglang engine ---
    sglang_urls: list[str] = setting([], "use these running SGLang servers instead of launching any")
    rollout_num_gpus: int = setting(1, "sglang: GPUs used for rollout (servers = this / per-engine GPUs)")
    rollout_num_gpus_per_engine: int = setting(
        1, "sglang: tensor-parallel size of each server", exclusive_minimum=0
    )
    sglang_mem_fraction_static: float = setting(
        0.8, "sglang: fraction of GPU memory for weights and KV cache"
    )
    sglang_port: int = setting(30000, "sglang: port of the first launched server (server i gets port + i)")
    sglang_host: str = setting("127.0.0.1", "sglang: host the launched servers bind")
    sglang_log_dir: str = setting("", "sglang: directory for server logs (default: a temporary directory)")
    sglang_enable_memory_saver: bool = setting(False, "sglang: allow release/resume memory occupation")
    sglang_extra_args: list[str] = setting(
        [], "sglang: extra launch_server arguments, e.g. --attention-backend fa3"
    )
    sglang_python: str = setting(
        "", "sglang: Python interpreter of launched servers (SGLang's own venv; default: this one)"
    )
    sglang_env: list[str] = setting(
        [],
        "sglang: KEY=VALUE environment of launched servers, over this process's environment",
        pattern=KEY_EQUALS_VALUE,
    )
    sglang_startup_timeout: float = setting(900.0, "sglang: seconds a server may take to become healthy")
    sglang_request_timeout: float = setting(3600.0, "sglang: seconds one /generate call may take")
    sglang_health_interval: float = setting(10.0, "sglang: seconds between supervisor health checks")
    sglang_max_restarts: int = setting(3, "sglang: restarts of a dead server before giving up")
    sglang_server_concurrency: int = setting(
        512, "sglang: in-flight /generate calls per server", exclusive_minimum=0
    )

    def check_required(self) -> None:
        """What a run cannot go without (a rollout service started bare gets it from its run)."""
        if not self.hf_checkpoint:
            raise ConfigError("hf_checkpoint", "is required (model directory with config and tokenizer)")

    def validate(self) -> None:
        """Rules across settings (each value's own range or shape is declared with it, above)."""
        if self.reward == "remote" and not self.rm_url:
            raise ConfigError("rm_url", "the 'remote' reward needs --rm-url")
        if self.reward == "custom" and not self.custom_rm_path:
            raise ConfigError("custom_rm_path", "the 'custom' reward needs --custom-rm-path module:function")
        if self.group_rm and not self.custom_rm_path:
            raise ConfigError("group_rm", "needs --custom-rm-path (the group function)")
        self._validate_environment()
        if self.rollout_engine == "sglang" and not self.sglang_urls:
            if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
                raise ConfigError("rollout_num_gpus", "must be a multiple of --rollout-num-gpus-per-engine")

    def _validate_environment(self) -> None:
        check_environment_settings(self.environment, self)
