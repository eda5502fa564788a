"""What the trainer does once its ranks broke: torchelastic's rule where something restarts it.

    a rank dies, or a command leaves the ranks out of step
      -> RankRuntime marks itself broken -> on_broken(settings, reason): health NOT_SERVING
      -> with exit_when_ranks_break: log the reason, drain briefly (the failing call still
         answers), stop the other ranks by pid, exit with RANKS_BROKEN_EXIT_CODE
      -> the launcher sees a dead trainer; the coordinator restarts it, and its Init spawns every
         rank afresh; the run resumes from its last checkpoint

A group that lost a rank cannot be mended in place: the survivors are out of step with each other
and torch.distributed cannot re-admit a rank. Exiting turns the death of any rank into the death
of the trainer, which every launcher already recovers from. Without the setting (a trainer a user
started, which nothing restarts) the trainer stays up NOT_SERVING, every call fails fast naming
the dead rank, and the next run's Init (or a recovery's rebuild) builds new ranks.
"""

from __future__ import annotations

import threading

from rollway.common.log import get_logger
from rollway.common.process_exit import RANKS_BROKEN_EXIT_CODE, exit_without_teardown
from rollway.common.server import RollwayServer
from rollway.trainer.config import TrainerConfig

log = get_logger("rollway.trainer.broken_ranks")

# The failing call answers within this (it names the dead rank to the coordinator) ...
DRAIN_SECONDS = 0.5
# ... and the process is gone within this, whatever the drain is stuck on: the coordinator gives a
# failed call's service 3 s (coordinator/watch.DEAD_GRACE_SECONDS) to be seen dead before failing the run.
EXIT_SECONDS = 2.0


class BrokenRanks:
    """The trainer's answer to broken ranks; `exit_code` is what serve() returns once it stopped."""

    def __init__(self, server: RollwayServer):
        self.server = server
        self.exit_code: int | None = None
        self._lock = threading.Lock()

    def on_broken(self, settings: TrainerConfig, reason: str) -> None:
        """Called once by the run's RankRuntime, from whichever thread found the ranks broken."""
        self.server.set_serving(False)
        if not settings.exit_when_ranks_break:
            return
        with self._lock:
            if self.exit_code is not None:
                return
            self.exit_code = RANKS_BROKEN_EXIT_CODE
        log.error(
            "trainer ranks broken: exiting so that the launcher restarts every rank",
            reason=reason,
            exit_code=RANKS_BROKEN_EXIT_CODE,
        )
        deadline = threading.Timer(EXIT_SECONDS, exit_without_teardown, args=(RANKS_BROKEN_EXIT_CODE,))
        deadline.daemon = True
        deadline.start()
        # Off this thread: it may be the compute thread that the drain's shutdown waits on.
        threading.Thread(
            target=self.server.stop, args=(DRAIN_SECONDS,), name="ranks-broken-stop", daemon=True
        ).start()
