"""Whether a RayServiceGroup's actors are alive, dead or cut off, asked by the coordinator's watch
every tick without ever blocking on an actor that does not answer.

    dead()                    each actor has one poll in flight (ServiceHost.poll); an answer says
                              whether its process exited, a RayActorError that the actor is gone
    unreachable(members)      a poll unanswered for UNREACHABLE_S: its node is cut off or lost;
                              not dead until Ray's verdict on the node (a partition that heals
                              costs nothing; its poll is sent again once the node answers)
    settle(members)           after a long silence that ended, wait out Ray's late verdict
    verdict_pending_seconds   how long a verdict on the silent nodes may still take

It is apart from the group (ray_services) because it runs on the watch thread while the group's
start, restart and stop run on the run thread: the polls' state has its own lock here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rollway.common.log import get_logger
from rollway.common.process_exit import describe_exit
from rollway.common.supervision import ray_nodes
from rollway.common.supervision.ray_group_actor import GroupActor, excerpt
from rollway.common.supervision.supervisor import DeadService

log = get_logger("rollway.common.supervision.ray")

POLL_WAIT_S = 1.0  # how long one dead() waits for the actors' polls (the watch ticks on)
UNREACHABLE_S = 3.0  # a poll unanswered this long: the actor's node is cut off or lost


class ActorWatch:
    """The polls of a group's actors; every method takes the actors it is asked about."""

    def __init__(self):
        self._poll_lock = threading.Lock()

    def dead(self, actors: list[GroupActor]) -> DeadService | None:
        """The first actor found dead (Ray says so, or its process exited). Each actor has one
        poll in flight at a time; one that does not come back is silence, judged by unreachable()
        and in the end by Ray's verdict on the node, never by this call blocking on it."""
        import ray

        polls = self._send_polls(actors)
        if not polls:
            return None
        ready, _ = ray.wait([poll for _, poll in polls], num_returns=len(polls), timeout=POLL_WAIT_S)
        answered = set(ready)
        for actor, poll in polls:
            if poll not in answered:
                continue
            with self._poll_lock:
                if actor.poll is poll:
                    actor.poll = None
                if actor.quiet_since:
                    actor.last_spell, actor.quiet_since = (actor.quiet_since, time.monotonic()), 0.0
            try:
                status = ray.get(poll)
            except ray.exceptions.RayActorError as exc:
                return DeadService(*actor.service_index, f"({actor.where}) died; its service is gone. "
                                   f"Ray says: {excerpt(str(exc))}")  # fmt: skip
            if status is not None:
                return DeadService(
                    *actor.service_index,
                    f"({actor.where}, pid {status['pid']}) {describe_exit(status['code'])}; "
                    f"last log lines:\n{status['log_tail']}",
                )
        return None

    def _send_polls(self, actors: list[GroupActor]) -> list[tuple[GroupActor, object]]:
        """A poll to each actor without one in flight, and again to one whose node answers after
        a long silence (a healed partition: the old poll may never come back)."""
        with self._poll_lock:
            now = time.monotonic()
            for actor in actors:
                if actor.poll is not None and not actor.quiet_since and now - actor.poll_sent > UNREACHABLE_S:
                    actor.quiet_since = actor.poll_sent
                if actor.poll is None:
                    actor.poll, actor.poll_sent = actor.handle.poll.remote(), now
                elif now - actor.poll_sent > 4 * UNREACHABLE_S and ray_nodes.node_answers(actor.node["id"]):
                    actor.poll, actor.poll_sent = actor.handle.poll.remote(), now  # a healed partition
            return [(actor, actor.poll) for actor in actors]

    def silent_seconds(self, actor: GroupActor) -> float:
        """How long its poll in flight has gone unanswered (0 when none is in flight)."""
        with self._poll_lock:
            return time.monotonic() - actor.poll_sent if actor.poll is not None else 0.0

    def unreachable(self, members: list[GroupActor]) -> str | None:
        """Why the instance made of `members` is cut off (None while each answers)."""
        for actor in members:
            silent = self.silent_seconds(actor)
            if silent > UNREACHABLE_S:
                return (
                    f"{actor.where} has not answered for {silent:.0f}s: its node is cut off or lost "
                    "(Ray's verdict on the node decides; a partition that heals costs no restart)"
                )
        return None

    def settle(self, members: list[GroupActor], stopping: Callable[[], bool]) -> DeadService | None:
        """Ray may declare a node lost after a long cut even once its link is back: wait for that
        verdict (or for its window to pass, or `stopping`) before a run goes on with the node's
        services."""
        for actor in members:
            if actor.last_spell is None:
                continue
            (start, end), actor.last_spell = actor.last_spell, None
            if end - start < ray_nodes.long_spell_s():
                continue
            log.warning("waiting for Ray's verdict on a node that was cut off", actor=actor.spec.name,
                        node=actor.node["ip"], silent_seconds=round(end - start, 1))  # fmt: skip
            late_verdict_s = ray_nodes.late_verdict_s()
            while time.monotonic() < start + late_verdict_s and not stopping():
                if not ray_nodes.node_alive(actor.node["id"]):
                    return DeadService(*actor.service_index, f"({actor.where}) was lost: Ray declared its node "
                                       f"dead after it was cut off for {end - start:.0f}s")  # fmt: skip
                time.sleep(ray_nodes.POLL_S)
        return None

    def verdict_pending_seconds(self, actors: list[GroupActor]) -> float:
        """The longest Ray may still take to give its verdict on a silent actor's node."""
        silent = [self.silent_seconds(a) for a in actors]
        return max([0.0, *(ray_nodes.VERDICT_TIMEOUT_S - s for s in silent if s > UNREACHABLE_S)])
