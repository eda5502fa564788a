"""Settings of a run, as the coordinator sees them (Miles' names).

The coordinator owns the batch arithmetic, the loop, advantages, the weight-sync schedule,
evaluation, run checkpoints and debug modes. Settings that other services also read (loss_type,
global_batch_size, num_epoch, ...) are declared here too, with the same type and
default as in those services' configs, so one flat run config reaches every component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollway.common import shared_settings
from rollway.common.advantages import ESTIMATORS
from rollway.common.config import (
    CALCULATOR_OR_MODULE_ATTR,
    MODULE_ATTR_OR_EMPTY,
    RUN_ID_OR_EMPTY,
    ConfigError,
    non_default_settings,
    setting,
)
from rollway.common.shared_settings import REWARD_NAMES

LossType = Literal["sft_loss", "policy_loss"]
# Eval pages generating at once (evaluation.py): the next page's rows join the engine's batch as
# the current page's finish, so a page's tail (a few long responses) does not run a near-empty batch.
EVAL_PAGES_IN_FLIGHT = 2
# What a run asks of Ray for its actors (common/supervision/placement.py reads them).
RAY_PLACEMENT_SETTINGS = (
    "ray_placement_strategy",
    "ray_trainer_num_cpus",
    "ray_trainer_num_gpus",
    "ray_rollout_num_cpus",
    "ray_dataloader_num_cpus",
    "ray_trainer_resources",
    "ray_rollout_resources",
    "ray_dataloader_resources",
)


@dataclass
class CoordinatorConfig:
    """Run settings: loop, batches, sampling, advantages, async, eval, checkpoints, debug."""

    # Run
    run_id: str = setting("", "run id; generated (time-based) when empty", pattern=RUN_ID_OR_EMPTY)
    run_dir: str = setting("", "directory holding one folder per run (empty: the coordinator's --runs-root)")
    resume: bool = setting(
        False,
        "StartRun with the id of a run that exists and did not succeed continues it (from its newest "
        "checkpoint under save; the steps it redoes replace their records); without it an existing id "
        "is refused, so no run's history is ever overwritten",
    )
    num_rollout: int = setting(
        10, "RL steps (rollouts) to run; for SFT, optimizer steps (0: num_epoch epochs)", minimum=0
    )
    rollout_seed: int = shared_settings.rollout_seed()
    loss_type: LossType = shared_settings.loss_type()
    num_epoch: int = shared_settings.num_epoch()

    # Batches
    rollout_batch_size: int = setting(
        8, "prompts per rollout (RL) or conversations per step (SFT)", exclusive_minimum=0
    )
    n_samples_per_prompt: int = shared_settings.n_samples_per_prompt()
    global_batch_size: int = setting(8, "samples per optimizer step", exclusive_minimum=0)
    over_sampling_batch_size: int = setting(
        0,
        "prompts requested per refill when dynamic sampling drops groups: at least rollout_batch_size, "
        "as in Miles (0: the missing groups' prompts only)",
        minimum=0,
    )
    dynamic_sampling_filter_path: str = setting(
        "",
        "group filter, e.g. check_reward_nonzero_std (drop zero-std groups)",
        choices=("", "check_reward_nonzero_std"),
    )
    partial_rollout: bool = setting(
        False, "samples aborted once a rollout has enough groups continue in the next rollout"
    )
    mask_offpolicy_in_partial_rollout: bool = setting(
        False, "partial rollout: loss-mask the tokens generated before the sample was aborted"
    )

    # Sampling
    rollout_temperature: float = shared_settings.rollout_temperature()
    rollout_top_p: float = shared_settings.rollout_top_p()
    rollout_top_k: int = shared_settings.rollout_top_k()
    rollout_max_response_len: int = shared_settings.rollout_max_response_len()
    rollout_stop: list[str] = shared_settings.rollout_stop()
    rm_type: str = setting(
        "", "reward function name (empty: the rollout service's default)", choices=("", *REWARD_NAMES)
    )

    # Advantages
    advantage_estimator: str = shared_settings.advantage_estimator(choices=ESTIMATORS)
    disable_grpo_std_normalization: bool = setting(
        False, "grpo/gspo: centre rewards without dividing by the group's std (Miles' Dr.GRPO switch)"
    )
    disable_rewards_normalization: bool = setting(
        False, "send raw rewards: no group mean/std normalisation for any estimator (Miles' flag)"
    )

    # Async and weight sync
    async_mode: bool = setting(
        False, "overlap generation of step k with training of step k-1", aliases=("async",)
    )
    max_weight_staleness: int = setting(
        1,
        "async: generate up to this many rollouts ahead of the one training; rollout k starts only "
        "on weights of version >= k + 1 - this, so its samples are at most this many versions old",
        minimum=1,
    )
    update_weights_interval: int = setting(1, "push weights every N rollouts", exclusive_minimum=0)
    update_weight_buffer_size: int = setting(
        512 * 1024 * 1024, "bytes per weight-sync bucket", bounds=(1, 2**53)
    )
    update_weight_transport: Literal["distributed", "disk"] = setting("distributed", "weight-sync transport")
    update_weight_timeout: float = setting(300.0, "seconds a weight update may take", exclusive_minimum=0)
    update_weight_master_addr: str = setting(
        "",
        "address of the weight group's store at trainer rank 0, as engines reach it (empty: trainer_addr's host)",
    )
    update_weight_master_port: int = setting(
        0,
        "port of that store (0: a free port of the coordinator's host; set it when the trainer runs elsewhere)",
        minimum=0,
        maximum=65535,
    )
    check_weight_update_equal: bool = setting(False, "scramble engine weights, sync, compare checksums")

    # Evaluation
    eval_interval: int = setting(
        0, "evaluate every N rollouts (0: never; the first and last step always when set)", minimum=0
    )
    eval_prompt_data: list[str] = shared_settings.eval_prompt_data()
    n_samples_per_eval_prompt: int = setting(
        1, "samples per eval prompt (pass@k uses them)", exclusive_minimum=0
    )
    eval_temperature: float = setting(0.0, "eval sampling temperature (0: greedy)", minimum=0)
    eval_batch_size: int = setting(
        0,
        "eval prompts per Generate, two generating at once (0: as many as keep those within the "
        "samples of a rollout, rollout_batch_size x n_samples_per_prompt, which the memory plan counts)",
        minimum=0,
    )

    # Checkpoints
    save: str = setting("", "directory for run checkpoints (trainer, dataloader cursor, coordinator)")
    save_interval: int = setting(
        0, "checkpoint every N steps (0: only at the end when save is set)", minimum=0
    )
    save_total_limit: int = setting(
        0,
        "after each save, keep only the newest N complete run checkpoints under save (0: keep all); "
        "the one the latest pointer names and the load checkpoint are never deleted",
        minimum=0,
    )
    async_save: bool = setting(
        False,
        "write checkpoints in the background (torch DCP, as torchtitan): the step goes on once the "
        "trainer has copied its state into memory (a model-sized copy of weights and AdamW state "
        "more), and a checkpoint counts, moves latest and rotates only when its write is complete",
    )
    on_checkpoint_error: str = setting(
        "fail",
        "a checkpoint that cannot be written (a full disk): fail the run naming it, or continue "
        "training and try again at the next save",
        choices=("fail", "continue"),
    )
    load: str = setting("", "resume from this run checkpoint directory (default: latest under save)")
    save_hf: str = setting(
        "", "at the end, write a Hugging Face export of the trained model under this directory"
    )

    # Debugging (Miles-compatible)
    debug_rollout_only: bool = setting(False, "generate and score only; no trainer")
    debug_train_only: bool = setting(False, "train only; no rollout service")
    save_debug_rollout_data: str = setting("", "write each rollout to this path; {rollout_id} is replaced")
    load_debug_rollout_data: str = setting(
        "", "replay rollouts from this path ({rollout_id}); implies train-only"
    )
    debug_determinism: bool = setting(False, "log per-step hashes of data, weights and losses")

    # Dashboard (what the run keeps for its Rollouts view)
    dashboard_rollout_groups: int = setting(
        8, "groups of each rollout kept in RUN_DIR/rollouts for the dashboard (0: none)", minimum=0
    )
    dashboard_rollout_steps: int = setting(
        200, "rollouts whose samples are kept, the newest (0: all)", minimum=0
    )
    dashboard_trainer_log_probs: bool = setting(
        False,
        "score the kept samples with the trainer before each step (one more forward pass over them, "
        "on the step's critical path): per-token entropy and trainer-minus-rollout log-probs in the dashboard",
    )

    # Supervision (services the coordinator started; attached ones can only be watched)
    max_restarts: int = setting(
        3,
        "restarts of dead services per run: the dead one is restarted and the run continues from its "
        "last checkpoint (save), or from the start without one; 0: a dead service fails the run",
        minimum=0,
    )
    restart_backoff_seconds: float = setting(
        1.0,
        "wait before a restart, doubled for each further restart before the run completes a step "
        "(at most 30 s)",
        minimum=0,
    )
    hung_service_seconds: float = setting(
        0.0,
        "a service is hung when it answers nothing (frozen) or a long call of it makes no progress "
        "(no micro-batch, token, bucket or reply) for this long: it is killed (SIGKILL) and recovered "
        "like a dead one; 0: 10x the median of that call's recent durations, at least 60 s",
        minimum=0,
    )

    # Services (attach mode; empty: the coordinator starts them)
    launcher: Literal["local", "ray"] = setting(
        "local", "where the services this run starts run: local processes, or Ray actors"
    )
    ray_address: str = setting(
        "", "launcher ray: the cluster to join (empty: RAY_ADDRESS, else a local Ray instance)"
    )
    ray_placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = setting(
        "PACK",
        "launcher ray: the strategy of the run's placement group (Ray's names): PACK on as few nodes "
        "as possible, SPREAD over as many, STRICT_PACK all on one node, STRICT_SPREAD one actor per node",
    )
    ray_trainer_num_cpus: float = setting(
        1.0, "launcher ray: CPUs each trainer rank's actor reserves", exclusive_minimum=0
    )
    ray_trainer_num_gpus: float = setting(
        1.0,
        "launcher ray: GPUs each trainer rank's actor reserves on a cluster with GPUs (0.5: two ranks a GPU)",
        minimum=0,
    )
    ray_rollout_num_cpus: float = setting(
        1.0,
        "launcher ray: CPUs each rollout service's actor reserves (its GPUs: rollout_num_gpus_per_engine)",
        exclusive_minimum=0,
    )
    ray_dataloader_num_cpus: float = setting(
        1.0, "launcher ray: CPUs the dataloader's actor reserves", exclusive_minimum=0
    )
    ray_trainer_resources: dict[str, float] = setting(
        {},
        "launcher ray: custom resources each trainer rank's actor reserves, e.g. {node_trainer: 1} to "
        "put the ranks on the nodes started with ray start --resources '{\"node_trainer\": 8}'",
    )
    ray_rollout_resources: dict[str, float] = setting(
        {}, "launcher ray: custom resources each rollout service's actor reserves (as ray_trainer_resources)"
    )
    ray_dataloader_resources: dict[str, float] = setting(
        {}, "launcher ray: custom resources the dataloader's actor reserves (as ray_trainer_resources)"
    )
    remote_environment: str = setting(
        "",
        "environment: remote with no environment_url: the Environment service the coordinator starts, "
        "health-checks, restarts (max_restarts) and stops with the run: calculator, or module:attr "
        "of an Environment class (or factory)",
        pattern=CALCULATOR_OR_MODULE_ATTR,
    )
    openenv_app: str = setting(
        "",
        "environment: openenv with no openenv_url: module:attr of the OpenEnv app (create_app) the "
        "coordinator serves in its own process (rollway.openenv_host), "
        "health-checks (/health), restarts (max_restarts) and stops with the run",
        pattern=MODULE_ATTR_OR_EMPTY,
    )
    trainer_addr: str = setting("", "address of a running trainer")
    rollout_addr: list[str] = setting([], "addresses of running rollout services")
    dataloader_addr: str = setting("", "address of a running dataloader")
    trainer_settings: dict = setting({}, "trainer settings sent with trainer.Init (lr, loss settings, ...)")

    @property
    def is_sft(self) -> bool:
        return self.loss_type == "sft_loss"

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * (1 if self.is_sft else self.n_samples_per_prompt)

    @property
    def eval_prompts_per_generate(self) -> int:
        """eval_batch_size, or as many eval prompts as keep the pages in flight within one
        rollout's samples (what the memory plan counts)."""
        if self.eval_batch_size:
            return self.eval_batch_size
        samples_per_page = self.samples_per_rollout // EVAL_PAGES_IN_FLIGHT
        return max(1, samples_per_page // max(self.n_samples_per_eval_prompt, 1))

    def validate(self) -> None:
        """Rules across settings (each value's own range or choices is declared with it, above)."""
        # Miles asserts the same; below it, a refill would have to ask for more than the setting says.
        if 0 < self.over_sampling_batch_size < self.rollout_batch_size:
            raise ConfigError(
                "over_sampling_batch_size",
                f"must be 0 (the missing prompts) or at least rollout_batch_size = {self.rollout_batch_size} "
                f"(got {self.over_sampling_batch_size})",
            )
        if self.samples_per_rollout % self.global_batch_size:
            raise ConfigError(
                "global_batch_size",
                f"rollout_batch_size * n_samples_per_prompt = {self.samples_per_rollout} is not divisible "
                f"by global_batch_size = {self.global_batch_size}",
            )
        if self.debug_rollout_only and (self.debug_train_only or self.load_debug_rollout_data):
            raise ConfigError(
                "debug_rollout_only", "cannot be combined with debug_train_only/load_debug_rollout_data"
            )
        if self.debug_rollout_only and self.is_sft:
            raise ConfigError("debug_rollout_only", "has no meaning with loss_type sft_loss")
        if len(self.eval_prompt_data) % 2:
            raise ConfigError("eval_prompt_data", "expects name path pairs")
        if self.partial_rollout and not self.dynamic_sampling_filter_path:
            raise ConfigError(
                "partial_rollout",
                "needs dynamic_sampling_filter_path (only a filtered rollout aborts samples)",
            )
        if self.mask_offpolicy_in_partial_rollout and not self.partial_rollout:
            raise ConfigError("mask_offpolicy_in_partial_rollout", "needs partial_rollout")
        if self.ray_address and self.launcher != "ray":
            raise ConfigError("ray_address", "needs launcher ray")
        self._validate_ray_placement()
        if self.remote_environment:
            self._validate_remote_environment()
        if self.openenv_app:
            self._validate_openenv_app()

    def _validate_ray_placement(self) -> None:
        changed = non_default_settings(self)
        for name in RAY_PLACEMENT_SETTINGS:
            value = getattr(self, name)
            if self.launcher != "ray" and name in changed:
                raise ConfigError(name, "needs launcher ray")
            if name.endswith("_resources"):
                for key, amount in value.items():
                    if key in ("CPU", "GPU", "memory", "object_store_memory"):
                        raise ConfigError(
                            name, f"{key} is not a custom resource (CPUs and GPUs have settings of their own)"
                        )
                    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                        raise ConfigError(name, f"{key}: must be a non-negative number (got {amount!r})")

    def _validate_remote_environment(self) -> None:
        if self.launcher == "ray":
            # Ray actors have no environment actor yet: refused rather than started off the cluster.
            raise ConfigError(
                "remote_environment",
                "is started as a local process, not with launcher ray: start the environment service "
                "yourself (python -m rollway.environment) and give environment_url",
            )

    def _validate_openenv_app(self) -> None:
        if self.launcher == "ray":
            raise ConfigError(
                "openenv_app",
                "is started as a local process, not with launcher ray: serve the OpenEnv app yourself "
                "(python -m rollway.openenv_host) and give openenv_url",
            )
        if self.remote_environment:
            raise ConfigError("openenv_app", "give remote_environment or openenv_app, not both")

    @property
    def weight_master_address(self) -> str:
        """Where trainer rank 0 hosts the weight group: the setting, else the trainer's host."""
        if self.update_weight_master_addr:
            return self.update_weight_master_addr
        host = self.trainer_addr.rpartition(":")[0].strip("[]") if ":" in self.trainer_addr else ""
        return host or "127.0.0.1"

    @property
    def train_only(self) -> bool:
        return self.debug_train_only or bool(self.load_debug_rollout_data) or self.is_sft


@dataclass
class CoordinatorServiceConfig:
    """Settings of the coordinator process itself (runs bring their own CoordinatorConfig)."""

    runs_root: str = setting("runs", "where runs started over gRPC write their directories by default")
    dashboard_host: str = setting(
        "127.0.0.1", "address the web dashboard binds; loopback unless told otherwise"
    )
    dashboard_port: int = setting(
        -1,
        "web dashboard port (-1: the gRPC port + DASHBOARD_PORT_OFFSET, or a free port when that is taken"
        " or gRPC's is 0; 0: no dashboard)",
    )
    dashboard_address_file: str = setting("", "write the dashboard's http:// address here once it serves")

    def validate(self) -> None:
        if not -1 <= self.dashboard_port < 65536:
            raise ConfigError("dashboard_port", f"must be -1, 0 or a port (got {self.dashboard_port})")
