"""python -m rollway.rollout: run the rollout service."""

from rollway.common.service_main import run_service
from rollway.rollout.config import RolloutConfig


def main(argv=None) -> None:
    run_service("rollout", [RolloutConfig], argv)


if __name__ == "__main__":
    main()
