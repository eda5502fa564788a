"""This machine's addresses as a run sees them: the one on the route to a peer, and the network
interface that holds an address (gloo picks its listening address by interface name)."""

from __future__ import annotations

import ipaddress
import socket

import psutil


def address_towards(host: str, port: int) -> str:
    """This machine's address on the route to `host` (a routing lookup: nothing is sent)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The network interface whose network holds `address` (an IP or a host name; lo for any
    127.x), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:  # a host name: the address it resolves to
        ip = ipaddress.ip_address(socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0])
    for name, entries in psutil.net_if_addrs().items():
        for entry in entries:
            if entry.family not in (socket.AF_INET, socket.AF_INET6) or not entry.netmask:
                continue
            try:
                network = ipaddress.ip_network(f"{entry.address.split('%')[0]}/{entry.netmask}", strict=False)
            except ValueError:
                continue
            if ip.version == network.version and ip in network:
                return name
    return None
