# Starts W rank processes (in their network namespaces when a Topology is given) with torchrun's environment, and waits for them; reads a --methods spec.
"""The ranks get the environment torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so a script launched here runs unchanged under torchrun."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import repo_path
from netns import Topology

REPO = repo_path.REPO


def method_spec(spec: str) -> tuple[str, dict]:
    """'int8' or 'intN:{"bits": 2}' (a benchmark's --methods): a method and its own config keys."""
    name, _, extra = spec.partition(":")
    try:
        config = json.loads(extra) if extra else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"method spec {spec!r}: the part after ':' is not JSON ({e.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"method spec {spec!r}: the part after ':' must be a JSON object")
    return name, config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv: list[str], world: int, topo: Topology | None, timeout_s: float,
              log_dir: str, extra_env: dict[str, str] | None = None) -> None:
    """Runs `python argv...` as W ranks; raises RuntimeError naming the rank and the tail of its
    log when one fails or the run passes `timeout_s`. The rank processes are always ended."""
    os.makedirs(log_dir, exist_ok=True)
    if topo is None:
        master, port, iface = "127.0.0.1", free_port(), "lo"
    else:
        master, port, iface = topo.address(0), 29500, topo.iface  # a fresh namespace: the port is free
    procs, logs = [], []
    try:
        for r in range(world):
            env = dict(os.environ)
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                       MASTER_ADDR=master, MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=iface,
                       OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            env["PYTHONPATH"] = os.pathsep.join(repo_path.python_path() + [p for p in (env.get("PYTHONPATH", ""),) if p])
            env.update(extra_env or {})
            prefix = topo.prefix(r) if topo is not None else []
            log = open(os.path.join(log_dir, f"rank{r}.log"), "w")
            logs.append(log)
            procs.append(subprocess.Popen(prefix + [sys.executable] + argv, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=REPO))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise RuntimeError(f"rank {failed[0]} exited with {codes[failed[0]]}:\n"
                                   + _tail(os.path.join(log_dir, f"rank{failed[0]}.log")))
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks still running after {timeout_s:.0f} s; rank 0 log:\n"
                                   + _tail(os.path.join(log_dir, "rank0.log")))
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"
