# Rate-limited links for benchmarks: one network namespace per rank on a bridge, each rank's link shaped with tc tbf.
"""A `Topology` is W network namespaces, one per rank, each joined to a bridge (in a hub
namespace of its own, so nothing is added to the host's namespace) by a veth pair. tc's token
bucket (tbf) shapes both directions of every rank's veth pair: the model of one NIC per node,
full duplex at `rate_gbit`. Everything is torn down on exit, also on error or Ctrl-C.

Needs root and iproute2. `Topology.available()` says whether namespaces can be made here, and
why not when they cannot.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

_PREFIX = "fcb"  # every namespace this module makes is named fcb<pid>..., so stale ones can be found


class TopologyError(RuntimeError):
    """A namespace, link or qdisc could not be made."""


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip"] + (["netns", "exec", netns, "ip"] if netns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TopologyError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TopologyError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def _list_netns() -> list[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_on_sigterm() -> None:
    """SIGTERM (timeout, kill) unwinds like Ctrl-C, so every `with Topology` tears down."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def remove_stale() -> list[str]:
    """Deletes namespaces this module made in a process that no longer exists (a killed run)."""
    removed = []
    for name in _list_netns():
        if not name.startswith(_PREFIX):
            continue
        digits = name[len(_PREFIX):].split("h")[0].split("r")[0]
        if digits.isdigit() and not _pid_alive(int(digits)):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(name)
    return removed


class Topology:
    """W ranks, each in its own namespace at 10.213.0.(r+1), linked through a bridge at `rate_gbit`
    (None: not shaped). Use as a context manager; `prefix(r)` is the command prefix that runs a
    process in rank r's namespace, `iface` the rank-side interface name inside it."""

    iface = "fcb0"

    def __init__(self, world: int, rate_gbit: float | None, latency_ms: float = 20.0):
        if world < 2:
            raise ValueError(f"a topology needs at least 2 ranks, got {world}")
        if rate_gbit is not None and not rate_gbit > 0:
            raise ValueError(f"rate_gbit must be positive or None, got {rate_gbit}")
        self.world = world
        self.rate_gbit = rate_gbit
        self.latency_ms = latency_ms
        tag = f"{_PREFIX}{os.getpid()}"
        self.hub = f"{tag}h"
        self.names = [f"{tag}r{r}" for r in range(world)]
        self._made: list[str] = []

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when namespaces, veth pairs, a bridge and tbf can be made here."""
        if shutil.which("ip") is None or shutil.which("tc") is None:
            return False, "iproute2 (ip, tc) is not installed (apt-get install iproute2)"
        if os.geteuid() != 0:
            return False, "network namespaces need root"
        try:
            with Topology(2, 1.0):
                pass
        except TopologyError as e:
            return False, str(e)
        return True, ""

    def address(self, rank: int) -> str:
        return f"10.213.0.{rank + 1}"

    def prefix(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[rank]]

    def tx_bytes_path(self) -> str:
        """Inside a rank's namespace (ip netns exec remounts /sys): bytes sent on its link."""
        return f"/sys/class/net/{self.iface}/statistics/tx_bytes"

    def _shape(self, dev: str, netns: str) -> None:
        if self.rate_gbit is None:
            return
        rate_bps = self.rate_gbit * 1e9
        # The bucket must hold a whole GSO super-packet (64 KiB) and about a millisecond of traffic,
        # or tbf drops packets instead of delaying them.
        burst = max(int(rate_bps / 8 * 1e-3), 128 * 1024)
        _run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
              "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", f"{self.latency_ms}ms"])

    def __enter__(self) -> "Topology":
        try:
            remove_stale()
            _ip("netns", "add", self.hub)
            self._made.append(self.hub)
            _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
            _ip("link", "set", "br0", "up", netns=self.hub)
            for r, name in enumerate(self.names):
                _ip("netns", "add", name)
                self._made.append(name)
                outer = f"{_PREFIX}p{r}"
                # Made inside the rank's namespace, then the hub end is moved: no name ever exists
                # in the host's namespace, so parallel runs cannot collide.
                _ip("link", "add", self.iface, "type", "veth", "peer", "name", outer, netns=name)
                _ip("link", "set", outer, "netns", self.hub, netns=name)
                _ip("addr", "add", f"{self.address(r)}/24", "dev", self.iface, netns=name)
                _ip("link", "set", self.iface, "up", netns=name)
                _ip("link", "set", "lo", "up", netns=name)
                _ip("link", "set", outer, "master", "br0", netns=self.hub)
                _ip("link", "set", outer, "up", netns=self.hub)
                self._shape(self.iface, name)   # what the rank sends
                self._shape(outer, self.hub)    # what the rank receives
        except BaseException:
            self.close()
            raise
        return self

    def dropped_packets(self) -> int | None:
        """Packets the shapers dropped (queue full) since setup: TCP recovers, but slowly, so a
        run with drops measured the shaper as much as the link."""
        if self.rate_gbit is None:
            return None
        total = 0
        devs = [(n, self.iface) for n in self.names] + [(self.hub, f"{_PREFIX}p{r}") for r in range(self.world)]
        for netns, dev in devs:
            proc = subprocess.run(["ip", "netns", "exec", netns, "tc", "-s", "qdisc", "show", "dev", dev],
                                  capture_output=True, text=True)
            words = proc.stdout.replace(",", " ").split()
            for i, w in enumerate(words[:-1]):
                if w == "dropped" and words[i + 1].isdigit():
                    total += int(words[i + 1])
        return total

    def close(self) -> None:
        """Deleting a namespace deletes the veth ends and qdiscs in it."""
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str:
        rate = "unshaped" if self.rate_gbit is None else f"tbf {self.rate_gbit:g} Gbit/s each way"
        return f"{self.world} namespaces on a bridge, one veth per rank, {rate}"
