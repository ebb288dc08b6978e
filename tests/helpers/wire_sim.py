"""W ranks of the compressed reduce-scatter in one process: each rank's CommState encodes, the
payloads are routed as all_to_all_single would route them, each rank decodes. The C calls are
those the collective makes (plan, begin, encode, decode), only the transport is a copy, so a
test can hand any rank any config, gradient or payload without spawning processes."""
from __future__ import annotations

import torch


def exchange(states, grads, outs, tamper=None):
    """One reduce-scatter call of every rank; tamper(src, dst, payload) may edit a payload (a
    uint8 tensor) in flight. Returns each rank's unit index."""
    world = len(states)
    units = [s._core.begin(g.numel()) for s, g in zip(states, grads)]
    sent = []
    for r, (s, g) in enumerate(zip(states, grads)):
        send_splits, _ = s._core.plan(g, world, r)
        send = torch.empty(sum(send_splits), dtype=torch.uint8)
        sizes = s._core.encode(g, send, world, r, units[r])
        parts, at = [], 0
        for size in sizes:
            parts.append(send[at:at + size].clone())
            at += size
        sent.append(parts)
    for r, (s, g) in enumerate(zip(states, grads)):
        parts = []
        for src in range(world):
            p = sent[src][r]
            if tamper is not None and p.numel():
                p = tamper(src, r, p)
            parts.append(p)
        recv = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
        s._core.decode(recv, g, outs[r], world, r, units[r])
    return units


def end_step(states):
    for s in states:
        s.end_step()
