"""Which address a process binds and advertises (DESIGN 6).

Every socket binds on one interface of its machine and advertises that
interface's address, so peers on other machines can reach it. Which one, in
order: an address given (the driver's: ``FluxJob(driver_host=...)`` or
Spark's ``spark.driver.host``), ``FLUX_HOST`` in the process's environment (an
administrator's choice per machine, e.g. in ``spark-env.sh``),
``SPARK_LOCAL_IP`` (what Spark itself binds on that machine), and otherwise
the interface the kernel would route through toward the controller (a UDP
socket "connected" to it sends nothing; its local end is that interface).
Loopback is what a process with no controller to reach and nothing
configured gets: one machine, as in tests.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import Optional, Tuple

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: unusable as an advertised address: they name no single interface
WILDCARDS = ("", "0.0.0.0", "::", "*")


class AddressError(ValueError):
    """A configured address this machine cannot bind or others cannot reach."""


def split_tcp(address: str) -> Tuple[str, int]:
    """``tcp://host:port`` -> (host, port)."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def resolve(host: str) -> str:
    """A host name or address -> an IPv4 address (ZeroMQ binds addresses, not names)."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise AddressError(f"cannot resolve host {host!r}: {exc}") from exc


def route_toward(peer_host: str) -> Optional[str]:
    """The local address the kernel uses to reach ``peer_host`` (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((resolve(peer_host), 9))
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def local_host(configured: str = "", controller: str = "") -> str:
    """The address this process binds and advertises (see the module's docstring)."""
    for source, value in (("the address given", configured),
                          ("FLUX_HOST", os.environ.get("FLUX_HOST", "")),
                          ("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", ""))):
        if value not in WILDCARDS:
            address = resolve(value)
            log.debug("binding on %s (from %s)", address, source)
            return address
    if controller:
        host, _ = split_tcp(controller)
        address = route_toward(host)
        if address is not None:
            return address
        log.warning("no route toward the controller at %s: binding on loopback", controller)
    return LOOPBACK


def boot_id() -> str:
    """This kernel's boot id: process ids name the same processes only under one kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def check_port_range(ports: Optional[Tuple[int, int]]) -> None:
    """Refuse a port range that cannot hold a socket (firewalled clusters)."""
    if ports is None:
        return
    low, high = ports
    if not (1024 <= low < high <= 65536):
        raise AddressError(f"ports must be a range (low, high) with 1024 <= low < high <= "
                           f"65536, got {ports!r}")
