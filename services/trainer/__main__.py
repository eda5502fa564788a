"""python -m rollway.trainer: run the trainer service."""

from rollway.common.service_main import run_service
from rollway.trainer.config import TrainerConfig


def main(argv=None) -> None:
    run_service("trainer", [TrainerConfig], argv)


if __name__ == "__main__":
    main()
