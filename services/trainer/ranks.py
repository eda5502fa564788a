"""Rank 0 starts ranks 1..N-1 as child processes and watches them.

Each worker is `python -m rollway.trainer.worker` with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the trainer's configuration as JSON. No orphans: a
worker watches rank 0 (rollway.common.parent_watch: ROLLWAY_PARENT_PID, and SIGKILL on Linux
when rank 0 dies where that is safe) and exits within a second of rank 0's death, even mid-load
or mid-collective; its command loop also exits as soon as rank 0's store stops answering. A
normal stop sends `shutdown`, then kills by pid.

With `spawn_workers` false nothing is spawned: a launcher (Ray) starts the same workers itself
and rank 0 only waits for them in its store; it then sees a dead worker as a failed collective
rather than by its pid, and the launcher watches the worker processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from rollway.common.config import to_dict
from rollway.common.cpu_threads import PASSIVE_WAIT_ENV
from rollway.common.log import get_logger
from rollway.common.parent_watch import child_env
from rollway.common.rank_env import CONFIG_ENV
from rollway.trainer.config import TrainerConfig

log = get_logger("rollway.trainer.ranks")


# The trainer's auth token, handed to the ranks it spawns: their commands are signed with a key
# derived from it (distributed.command_key). Ray's workers have it from their environment.
AUTH_TOKEN_ENV = "ROLLWAY_AUTH_TOKEN"


class WorkerRanks:
    """The child processes of ranks 1..N-1 (none when world_size is 1)."""

    def __init__(self, config: TrainerConfig, master_addr: str, master_port: int, auth_token: str = ""):
        self.procs: dict[int, subprocess.Popen] = {}
        # Popen.poll() from two threads at once answers "still running" to one of them.
        self._poll_lock = threading.Lock()
        if not config.spawn_workers:  # ranks 1..N-1 are started elsewhere (Ray) and join the store
            log.info("waiting for ranks started elsewhere", world_size=config.world_size)
            return
        for rank in range(1, config.world_size):
            env = {
                **child_env(),  # the worker dies with this process (worker.py watches it)
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(config.world_size),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                **PASSIVE_WAIT_ENV,  # the engine sets the rank's threads (common/cpu_threads.py)
                CONFIG_ENV: json.dumps(to_dict(config)),
                AUTH_TOKEN_ENV: auth_token,  # the key of rank 0's signed commands derives from it
            }
            self.procs[rank] = subprocess.Popen([sys.executable, "-m", "rollway.trainer.worker"], env=env)
            log.info("spawned rank", rank=rank, pid=self.procs[rank].pid)

    @property
    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.procs.items()}

    def dead(self) -> dict[int, int]:
        """Ranks whose process has exited, with their exit codes."""
        with self._poll_lock:
            return {rank: proc.returncode for rank, proc in self.procs.items() if proc.poll() is not None}

    def wait(self, timeout_s: float) -> bool:
        """Wait until every worker has exited; True if they all did within the timeout."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill(self) -> None:
        """SIGKILL every worker still running, by pid, and reap it."""
        for rank, proc in self.procs.items():
            if proc.poll() is None:
                log.warning("killing rank", rank=rank, pid=proc.pid)
                proc.kill()
                proc.wait()
