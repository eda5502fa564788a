"""python -m rollway.coordinator: run the coordinator service."""

from rollway.common.service_main import run_service
from rollway.coordinator.config import CoordinatorServiceConfig


def main(argv=None) -> None:
    run_service("coordinator", [CoordinatorServiceConfig], argv)


if __name__ == "__main__":
    main()
