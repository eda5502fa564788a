"""`python -m rollway.trainer.worker`: trainer rank 1..N-1, started by rank 0 (ranks.py).

It joins rank 0's store and process group, builds its model shard, then runs the commands rank 0
posts (commands.py) until Shutdown. Any error is left in the store for rank 0 and ends the process: after a
failed command the ranks' collectives are out of step, and rank 0 reports the trainer as broken.
"""

from __future__ import annotations

import json
import os
import signal
import traceback

import torch.distributed as dist

from rollway.common.config import from_dict
from rollway.common.log import bind_run_context, configure_logging, get_logger
from rollway.common.parent_watch import watch_parent
from rollway.common.process_exit import exit_without_teardown
from rollway.trainer.commands import Shutdown, execute
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import (
    CommandChannel,
    CommandRefused,
    command_key,
    create_store,
    init_process_group,
)
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.ranks import AUTH_TOKEN_ENV, CONFIG_ENV


def main() -> int:
    watch_parent(lambda _rank0_pid: os._exit(1), death_signal=signal.SIGKILL)  # no orphan rank
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = from_dict(TrainerConfig, json.loads(os.environ[CONFIG_ENV]))
    configure_logging("trainer", "json")
    bind_run_context(rank=rank)
    log = get_logger("rollway.trainer.worker")
    parent = os.getppid()
    timeout = config.distributed_timeout_seconds
    store = create_store(rank, world_size, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout)
    channel = CommandChannel(store, rank, command_key(os.environ.get(AUTH_TOKEN_ENV, "")))
    store.set(f"ready/{rank}", b"1")
    try:
        engine = TrainerEngine(config, init_process_group(store, rank, world_size, timeout))
        log.info("rank ready", num_parameters=engine.num_parameters)
        while True:
            command = channel.receive(lambda: os.getppid() == parent)
            if isinstance(command, Shutdown):
                engine.writer.wait()  # rank 0 waits for the checkpoint in flight too (close_run)
                break
            execute(engine, command)
    except CommandRefused as exc:  # rank 0 learns why this rank left (read_error)
        channel.report_error(str(exc))
        log.error("rank exiting", reason=str(exc))
        return 1
    except SystemExit as exc:
        log.warning("rank exiting", reason=str(exc))
        return 1
    except BaseException as exc:
        channel.report_error(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        log.exception("rank failed")
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    log.info("rank stopped")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo may abort in interpreter teardown (common/process_exit.py)
