"""A torch.distributed TCPStore server that listens on one address, not on every interface.

torch's `TCPStore(host_name, port, is_master=True)` ignores `host_name` for its listening socket
and binds `[::]:port` (every interface, IPv4 included): anyone who can reach the machine could
read and write the store's keys (a weight group's rendezvous, the trainer's commands). torch
also accepts an already-listening socket (`master_listen_fd`, libuv and classic servers alike,
torch >= 2.4); the store then owns that descriptor and closes it with the store. So rollway
binds the socket itself, to the run's address, and hands it over.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

# Backlog of the listening socket: every member of a large group connects at about the same time.
LISTEN_BACKLOG = 1024


class StoreBindError(RuntimeError):
    """The store's address is not one this machine can listen on (or the port is taken)."""


def listen_socket(address: str, port: int) -> socket.socket:
    """A TCP socket listening on `address`:`port` (port 0 picks a free one); StoreBindError if not."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise StoreBindError(f"cannot resolve the store's address {address!r}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A port freed a moment ago (a rebuilt group on a fixed port) may still have connections in
        # TIME_WAIT; SO_REUSEADDR lets it be bound again, and still refuses a port in use.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise StoreBindError(
            f"cannot listen on {address}:{port} for the store ({exc.strerror}): the address must be "
            "one of this machine's (the run's address), and the port free"
        ) from None
    return sock


def host_store(address: str, port: int, world_size: int | None, timeout: timedelta) -> dist.TCPStore:
    """The store server, listening on `address` only; read `.port` for the port it got."""
    sock = listen_socket(address, port)
    bound_port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the descriptor from here on and closes it with the store
    try:
        return dist.TCPStore(
            address,
            bound_port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    except BaseException:
        os.close(fd)
        raise
