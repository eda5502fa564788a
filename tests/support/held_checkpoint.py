"""Fault injection for async_save: the trainer's background write of one step holds once its
shards are written, before it returns, so the checkpoint is never finished (no manifest, still in
its temporary directory) until the process is killed.

    python -m support.held_checkpoint --hold-step STEP TRAINER_ARGS...

A test that kills the trainer mid-write then catches the write in flight by construction, not by
a race between the writer and the kill (issue #36). The production writer knows nothing of it: it
wraps BackgroundWriter.write, the hook the writer keeps for this.
"""

from __future__ import annotations

import argparse
import sys
import time

HOLD_SECONDS = 120.0  # a held write gives up after this: a test that never kills fails, not hangs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--hold-step", type=int, required=True)
    held, trainer_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)

    from rollway.trainer import async_save

    marker = f"iter_{held.hold_step:07d}"
    setup = async_save.BackgroundWriter.__init__

    def held_writer(writer: async_save.BackgroundWriter, rank: int) -> None:
        setup(writer, rank)
        write = writer.write

        def held_write(staged, directory, group) -> None:
            write(staged, directory, group)
            if marker in directory.name:
                time.sleep(HOLD_SECONDS)
                raise TimeoutError(f"the write of {directory} was held {HOLD_SECONDS:.0f} s and not killed")

        writer.write = held_write

    async_save.BackgroundWriter.__init__ = held_writer
    from rollway.trainer.__main__ import main as trainer_main

    trainer_main(trainer_args)


if __name__ == "__main__":
    main()
