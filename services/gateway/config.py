"""Settings of the Tinker-compatible gateway (flags: `rollway gateway --help`)."""

from __future__ import annotations

from dataclasses import dataclass

from rollway.common.config import ConfigError, setting


@dataclass
class GatewayConfig:
    """Where the gateway listens, who may call it, and what it may start."""

    host: str = setting("127.0.0.1", "address to bind (loopback by default: the API trains models)")
    port: int = setting(0, "TCP port (0: a free one, written to --port-file)")
    port_file: str = setting("", "file to write the bound port into once serving")
    token: str = setting(
        "",
        "API key the SDK must send (X-API-Key; TINKER_API_KEY); starts with 'tml-'; empty: "
        "read ROLLWAY_GATEWAY_TOKEN",
    )
    tokens_file: str = setting(
        "",
        "JSON file {tenant: API key}: one key per tenant (each 'tml-...'); a tenant sees only its own "
        "sessions, models, futures and checkpoints (with --token, that key is tenant 'default')",
    )
    log_format: str = setting("json", "log lines as json or console text", choices=("json", "console"))
    workdir: str = setting("gateway", "directory for the services' logs and the checkpoints")
    session_timeout_s: float = setting(60.0, "a session without a heartbeat this long releases its models")
    max_models: int = setting(4, "most models (trainer services) served at once; more are refused")
    memory_budget_gb: float = setting(
        0.0,
        "memory the trainers may take together, GiB (0: what is available when the gateway starts); a model "
        "whose estimate (memory.py) does not fit is refused",
    )
    share_lora_base: bool = setting(
        True,
        "LoRA models of one base model (and rank) share one trainer: the base weights once in memory, each "
        "model its own adapters and optimizer state; false: a trainer per model, as full fine-tuning",
    )
    sampler_idle_s: float = setting(
        300.0,
        "a base model's rollout service (shared by its samplers) that sampled nothing this long stops; the "
        "next sample starts it again",
    )
    dtype: str = setting("float32", "dtype the trainers train in", choices=("float32", "bfloat16"))
    startup_timeout_s: float = setting(300.0, "how long a trainer may take to load its model")
    launcher: str = setting(
        "local",
        "how each model's trainer starts: a local process, or a Ray actor (as a run's `launcher: ray`)",
        choices=("local", "ray"),
    )
    ray_address: str = setting(
        "", "launcher ray: the cluster to join (empty: RAY_ADDRESS, else a local Ray instance)"
    )

    def __post_init__(self) -> None:
        if self.token and not self.token.startswith("tml-"):
            raise ConfigError("token", "must start with 'tml-' (the tinker SDK refuses other keys)")
        if self.session_timeout_s <= 0:
            raise ConfigError("session_timeout_s", "must be > 0")
        if self.sampler_idle_s <= 0:
            raise ConfigError("sampler_idle_s", "must be > 0")
        if self.memory_budget_gb < 0:
            raise ConfigError("memory_budget_gb", "must be >= 0")
        if self.ray_address and self.launcher != "ray":
            raise ConfigError("ray_address", "needs --launcher ray")
        if self.max_models < 1:
            raise ConfigError("max_models", "must be >= 1")
