"""python -m rollway.coordinator: run the coordinator service."""

from rollway.common.service_main import run_service
from rollway.coordinator.config import CoordinatorConfig


def main(argv=None) -> None:
    run_service("coordinator", [CoordinatorConfig], argv)


if __name__ == "__main__":
    main()
