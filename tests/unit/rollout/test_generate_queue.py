"""GenerateQueue: slots handed over in FIFO order, cancelled waiters leave, closing ends waiters."""

import threading

import pytest
from support.waiting import wait_until

from rollway.common.errors import ResourceExhausted, Unavailable
from rollway.rollout.generate_queue import GenerateQueue


class Waiter(threading.Thread):
    def __init__(self, queue, order, name):
        super().__init__(daemon=True)
        self.queue, self.order, self.name = queue, order, name
        self.active, self.cancel_callbacks, self.error, self.admitted = True, [], None, None
        self.release = threading.Event()
        self.start()

    def run(self):
        try:
            with self.queue.slot(lambda: self.active, self.cancel_callbacks.append) as admitted:
                self.admitted = admitted
                if admitted:
                    self.order.append(self.name)
                    self.release.wait(10)
        except Exception as exc:
            self.error = exc

    def cancel(self):
        self.active = False
        for callback in self.cancel_callbacks:
            callback()


def test_slots_pass_in_fifo_order_and_a_cancelled_waiter_leaves():
    queue, order = GenerateQueue(max_running=1, max_queued=3, timeout=30), []
    first = Waiter(queue, order, "first")
    wait_until(lambda: order == ["first"])
    waiters = []
    for name in ("a", "b", "c"):
        waiters.append(Waiter(queue, order, name))
        wait_until(lambda n=len(waiters): queue.num_queued == n)
    with pytest.raises(ResourceExhausted, match="--generate-queue-size 3"):
        with queue.slot(lambda: True, lambda cb: None):
            pass
    waiters[1].cancel()
    wait_until(lambda: queue.num_queued == 2)
    waiters[1].join(5)
    assert waiters[1].admitted is False and waiters[1].error is None
    first.release.set()
    wait_until(lambda: order == ["first", "a"])
    waiters[0].release.set()
    wait_until(lambda: order == ["first", "a", "c"])
    waiters[2].release.set()
    wait_until(lambda: queue.num_running == 0 and queue.num_queued == 0)


def test_close_ends_waiters_and_refuses_new_calls_but_running_ones_keep_their_slot():
    queue, order = GenerateQueue(max_running=1, max_queued=2, timeout=30), []
    running = Waiter(queue, order, "running")
    wait_until(lambda: order == ["running"])
    waiting = Waiter(queue, order, "waiting")
    wait_until(lambda: queue.num_queued == 1)
    queue.close()
    waiting.join(5)
    assert isinstance(waiting.error, Unavailable) and queue.num_queued == 0
    with pytest.raises(Unavailable):
        with queue.slot(lambda: True, lambda cb: None):
            pass
    assert queue.num_running == 1
    running.release.set()
    running.join(5)
    assert queue.num_running == 0 and running.error is None
