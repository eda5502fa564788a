"""python -m rollway.dataloader: run the dataloader service."""

from rollway.common.service_main import run_service
from rollway.dataloader.config import DataloaderConfig


def main(argv=None) -> None:
    run_service("dataloader", [DataloaderConfig], argv)


if __name__ == "__main__":
    main()
