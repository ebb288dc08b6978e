"""Ranks agree before they exchange. Payload sizes and meanings are pure functions of (method,
wire config, dtype, unit size, world), so ranks that disagree on any of them either abort inside
gloo (a message larger than its receive buffer) or silently sum garbage. The first time a state
reduces a unit shape on a process group, every rank all-gathers an 8-byte digest of that
description (one extra collective, counted); if the digests differ, the ranks all-gather the
descriptions themselves and every rank raises the same ValueError naming the keys that differ.
The steady state costs one set lookup per call.

What a handshake has settled is kept per process group, so a state rebuilt with the same config
on one rank (a re-registered hook, a reloaded checkpoint) does not handshake alone while its
peers exchange. A state rebuilt with another config whose exchange looks the same (same plan,
same pieces) goes on without one as well: every payload header carries the config's fingerprint,
so the first exchange is a PayloadError on every rank, with the keys named where this process
has seen both configs (explain()). Only a rank that changes its payload sizes alone is left: it
handshakes while its peers exchange, a collective mismatch that torch.distributed reports when
the process group's timeout expires (docs/design.md, "Ranks agree before they exchange")."""
from __future__ import annotations

import hashlib
import json
import re
import time
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _C
from ._dist import all_gather_single, settled


# per process group: {(numel, dtype, world): (digest, description, exchange signature)}
_agreed: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
# C fingerprint -> (method, wire config) of every state this process made: names the keys of a
# PayloadError for another config
_known: dict[int, dict[str, Any]] = {}


class Handshake:
    """The agreements of one CommState: what it has settled, per (process group, shape)."""

    def __init__(self, core, method: str | None = None, keys: dict[str, Any] | None = None):
        """method, keys: the reducer's method (None: the core's codec) and the keys its core does
        not hold, described beside the core's wire config (a method that is not a codec drives a
        `none` core)."""
        self._core = core  # wire_config, fingerprint; add_comm counts the handshakes
        self._method = method or core.method
        self._keys = dict(keys or {})
        self._settled: set = set()  # (group, key): the steady state's one lookup
        if self._method == core.method:
            # the fingerprint names this config in a PayloadError another rank's state raises
            _known[core.fingerprint] = {"method": core.method, **core.wire_config}

    def _description(self, what: dict[str, Any], dtype: torch.dtype, world: int) -> dict[str, Any]:
        return {**what, "method": self._method, **self._core.wire_config, **self._keys,
                "wire_version": _C.WIRE_VERSION, "dtype": str(dtype).replace("torch.", ""), "world": world}

    def before_reduce(self, group, grad: torch.Tensor, world: int, signature: Callable[[], tuple],
                      detail: Callable[[], dict] | None = None) -> None:
        """Before the first exchange of this shape by this state: the handshake, when needed.
        signature(): what the exchange looks like from this rank (Exchange.signature); detail():
        more of the description (a low-rank method: which matrices it compresses)."""
        if world == 1:
            return
        group = _group_of(group)
        key = (grad.numel(), grad.dtype, world)
        if (group, key) in self._settled:
            return
        desc = self._description({"unit_numel": grad.numel(), **(detail() if detail else {})}, grad.dtype, world)
        self._settle(group, key, desc, signature(), grad.device)

    def before_param_gather(self, group, shard: torch.Tensor, world: int) -> None:
        """Before the first parameter all-gather (fsdpcomp.AllGather) of this shard shape: ranks
        whose param_gather codecs differ would all-gather payloads of different sizes (gloo
        aborts) or decode each other's weights with the wrong codec. The same handshake, over
        the gather's group; any change of what a rank would send handshakes again."""
        if world == 1:
            return
        group = _group_of(group)
        key = ("param_gather", shard.numel(), shard.dtype, world)
        if (group, key) in self._settled:
            return
        desc = self._description({"exchange": "parameter all-gather", "shard_numel": shard.numel()},
                                 shard.dtype, world)
        self._settle(group, key, desc, None, shard.device)

    def _settle(self, group, key, desc: dict, sig, device: torch.device) -> None:
        """Handshakes unless this process group has settled the same description for this key,
        or (sig given) one whose exchange looks the same (the header fingerprint catches the rest)."""
        digest = hashlib.blake2b(json.dumps(desc, sort_keys=True).encode(), digest_size=8).digest()
        table = _agreed.setdefault(group, {})
        settled = table.get(key)
        if settled is None or (settled[0] != digest and (sig is None or settled[2] != sig)):
            _handshake(self._core, group, desc, digest, device, desc["world"])
            table[key] = (digest, desc, sig)
        self._settled.add((group, key))


def _group_of(group):
    return group if group is not None else dist.group.WORLD


def _handshake(core, group, desc, digest: bytes, device: torch.device, world: int) -> None:
    backend = str(dist.get_backend(group))
    device = device if backend == "nccl" else torch.device("cpu")
    mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
    every = torch.empty(world * len(digest), dtype=torch.uint8, device=device)
    t0 = time.perf_counter()
    settled(lambda out, inp: all_gather_single(out, inp, group=group), every, mine)
    core.add_comm(time.perf_counter() - t0, header_bytes=len(digest) * (world - 1), extra=True)
    digests = every.cpu().view(world, len(digest))
    if bool((digests == digests[0]).all()):
        return
    t0 = time.perf_counter()
    descs = _gather_descriptions(group, desc, world, device)
    core.add_comm(time.perf_counter() - t0, extra=True)
    raise ValueError(_disagreement(descs, desc))


def _gather_descriptions(group, desc: dict, world: int, device: torch.device) -> list[dict]:
    """Every rank's description, as JSON over two all-gathers (lengths, then padded bytes) of
    tensors this module owns, settled before the ValueError leaves (dist.all_gather_object's
    own tensors could not be waited for: _dist.py says why that matters)."""
    data = json.dumps(desc, sort_keys=True).encode()
    lengths = torch.empty(world, dtype=torch.int64, device=device)
    settled(lambda out, inp: all_gather_single(out, inp, group=group), lengths,
            torch.tensor([len(data)], dtype=torch.int64, device=device))
    lengths = lengths.tolist()
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    every = torch.empty(world * longest, dtype=torch.uint8, device=device)
    settled(lambda out, inp: all_gather_single(out, inp, group=group), every, mine.to(device))
    rows = every.cpu().view(world, longest)
    return [json.loads(bytes(rows[r, :n].tolist())) for r, n in enumerate(lengths)]


def _disagreement(descs: list[dict], mine: dict) -> str:
    keys = sorted({k for d in descs for k in d if any(e.get(k, "(absent)") != descs[0].get(k, "(absent)") for e in descs)})
    lines = [f"  '{k}': " + ", ".join(f"rank {r}: {d.get(k, '(absent)')!r}" for r, d in enumerate(descs))
             for k in keys]
    what = (f"a unit of {mine['unit_numel']}" if "unit_numel" in mine
            else f"the parameter all-gather of a shard of {mine['shard_numel']}")
    return (f"ranks disagree on what goes on the wire for {what} {mine['dtype']} elements over "
            f"{mine['world']} ranks (checked before the first exchange of each shape); run every "
            f"rank with the same method and config. Keys that differ ({', '.join(keys)}):\n"
            + "\n".join(lines))


_FINGERPRINTS = re.compile(r"fingerprint ([0-9a-f]{8}), this rank's ([0-9a-f]{8})")


def explain(error: Exception) -> Exception:
    """A PayloadError for another config, with the keys that differ where this process knows the
    sender's config (it made a state with it); the error itself otherwise."""
    found = _FINGERPRINTS.search(str(error))
    if found is None:
        return error
    theirs, ours = (_known.get(int(h, 16)) for h in found.groups())
    if theirs is None or ours is None:
        hint = ("the sender's config is not one this process has used: a rank rebuilt its state "
                "with another config after the ranks agreed on this unit shape")
    else:
        keys = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
        hint = "keys that differ: " + ", ".join(
            f"'{k}' (sender {theirs.get(k, '(absent)')!r}, this rank {ours.get(k, '(absent)')!r})"
            for k in keys)
    return type(error)(f"{error}; {hint}")
