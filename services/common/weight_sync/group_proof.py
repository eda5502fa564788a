"""Members of a weight group prove they hold the run's secret before any weights move.

    secret  = HMAC-SHA256(auth token, "rollway weight group " + group name)   (per group, so per run)
    rank 0  --broadcast-->  nonce (32 fresh random bytes)
    every r --allgather-->  HMAC-SHA256(secret, nonce || r)
    every member checks every proof; one wrong proof: the group is refused on every member

Why over the formed group and not in the store: a TCPStore server runs no code of ours, and any
client that reaches it can list its keys (`list_keys`), so a secret key name or a value in the
store proves nothing. The proofs travel on the group's own connections, so a process that took
a member's place in the rendezvous is the one that has to answer, with a nonce it has never seen.
The auth token itself never leaves the process; without a token the secret is empty (no auth
configured, as for gRPC), and the check still catches a member whose token differs.

An SGLang server joins the group by itself and cannot answer; groups with SGLang members skip the
check (WeightGroupSpec.authenticate_members is false) and rely on the store's bind address.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import torch
import torch.distributed as dist

PROOF_BYTES = 32


class MembershipRefused(RuntimeError):
    """A member of the group did not prove that it holds the run's secret."""


def group_secret(auth_token: str, group_name: str) -> bytes:
    """The secret of one group, derived from the services' auth token ("" without one)."""
    return hmac.new(
        auth_token.encode(), f"rollway weight group {group_name}".encode(), hashlib.sha256
    ).digest()


def proof(secret: bytes, nonce: bytes, rank: int) -> bytes:
    """What member `rank` answers to `nonce`."""
    return hmac.new(secret, nonce + rank.to_bytes(4, "big"), hashlib.sha256).digest()


def check_members(pg, rank: int, world_size: int, device: torch.device, secret: bytes) -> None:
    """Run the exchange on process group `pg` (a backend object); MembershipRefused naming the
    ranks whose proof is wrong (rank 0 wrong: the host is not the run's trainer)."""
    nonce = torch.zeros(PROOF_BYTES, dtype=torch.uint8, device=device)
    if rank == 0:
        nonce.copy_(torch.frombuffer(bytearray(secrets.token_bytes(PROOF_BYTES)), dtype=torch.uint8))
    options = dist.BroadcastOptions()
    options.rootRank = 0
    pg.broadcast([nonce], options).wait()
    nonce_bytes = bytes(nonce.cpu().tolist())
    mine = torch.frombuffer(bytearray(proof(secret, nonce_bytes, rank)), dtype=torch.uint8).to(device)
    answers = [torch.zeros_like(mine) for _ in range(world_size)]
    pg.allgather([answers], [mine]).wait()
    wrong = [
        r
        for r, answer in enumerate(answers)
        if not hmac.compare_digest(bytes(answer.cpu().tolist()), proof(secret, nonce_bytes, r))
    ]
    if wrong:
        raise MembershipRefused(_refusal(rank, world_size, wrong))


def _refusal(rank: int, world_size: int, wrong: list[int]) -> str:
    rule = "join refused: a weight group's members must prove the run's secret (derived from --auth-token)"
    if rank != 0 and len(wrong) == world_size - 1:  # only my own proof matches my secret
        return f"{rule}; this member's does not match the group's (its auth token differs from the trainer's)"
    if rank != 0 and 0 in wrong:
        return f"{rule}; the group's host (rank 0) did not prove it"
    return f"{rule}; rank(s) {', '.join(map(str, wrong))} did not"
