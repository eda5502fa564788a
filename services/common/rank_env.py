"""How a trainer rank 1..N-1 gets its settings: the environment variable its starter sets (rank 0
in rollway.trainer.ranks, or a Ray actor in rollway.common.supervision.ray_actors) and
rollway.trainer.worker reads. Declared here so that both starters share it without the
supervision code importing the trainer."""

CONFIG_ENV = "ROLLWAY_TRAINER_CONFIG"  # the TrainerConfig as JSON (rollway.common.config.to_dict)
