"""Start rollway services as real processes for tests (see rollway.common.local_launch)."""

from rollway.common.local_launch import ServiceProcess

__all__ = ["ServiceProcess"]
