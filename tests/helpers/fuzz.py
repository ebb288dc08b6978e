"""Fuzzing fsdpcomp's C entry points with hostile input: mutated payloads (decompress, the
collective's decode, decode_part), configs (dicts and JSON text), tensors (encode, decode,
compress, reduce_scatter) and checkpoints (load_state_dict). Every input must either work or
raise one of the documented exceptions (ValueError, TypeError, fsdpcomp.PayloadError) with the
state exactly as it was; anything else is counted:

  undocumented   another exception type
  corruption     a refusal that changed state, a header corruption that was accepted, a
                 finite input that came out non-finite, a refused payload that touched its output
  crash          the process dies (faulthandler prints the input's case; see --log)

    python tests/helpers/fuzz.py --seconds 600            # a long run; prints the counts
    python tests/helpers/fuzz.py --seconds 300 --seed 7

tests/core/test_fuzz.py runs a bounded number of inputs per method with a fixed seed (CI, and the
ASan+UBSan job)."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import faulthandler
import json
import math
import os
import random
import sys
import time

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # run as a script: `python tests/helpers/fuzz.py`
    sys.path.insert(0, TESTS)

import fsdpcomp  # noqa: E402
from fsdpcomp import _C  # noqa: E402
from helpers.method_cases import CASES  # noqa: E402

DOCUMENTED = (ValueError, TypeError)  # PayloadError is a ValueError
METHOD_CASES = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {})] + CASES
HEADER = _C.HEADER_BYTES
# header bytes a receiver must refuse any change of: all but the body size of a data-dependent
# payload (bytes 22..27, fc_wire.h) and the NaN flag (bit 0 of byte 5)
FLAG_BYTE, BODY_FIELD = 5, range(22, 28)
ALWAYS_VALID = {"roundtrip"}  # checks of accepted inputs, not entry points (Tally.blind)


class Tally:
    """Counts per entry point: inputs tried, accepted, refusals by type, failures by kind."""

    def __init__(self):
        self.tried = collections.Counter()
        self.accepted = collections.Counter()
        self.refused = collections.defaultdict(collections.Counter)
        self.failures = collections.defaultdict(list)

    def fail(self, kind, entry, what):
        self.failures[kind].append(f"{entry}: {what}")

    def refusals(self, entry) -> int:
        return sum(self.refused[entry].values())

    def blind(self) -> list[str]:
        """Entry points that saw only valid or only hostile inputs (a blind half: a check of
        the refusals, or of the accepted calls, that never ran). `roundtrip` is a check on
        accepted configs, not an entry point: only ever valid."""
        return [e for e in sorted(self.tried) if e not in ALWAYS_VALID and
                (self.accepted[e] == 0 or self.refusals(e) == 0)]

    def table(self) -> str:
        lines = [f"{'entry point':<16} {'inputs':>8} {'accepted':>9} {'refused':>8}  refused by type"]
        blind = self.blind()
        for entry in sorted(self.tried):
            ref = ", ".join(f"{k} {v}" for k, v in sorted(self.refused[entry].items()))
            mark = "  BLIND: " + ("nothing accepted" if self.accepted[entry] == 0 else "nothing refused") \
                if entry in blind else ""
            lines.append(f"{entry:<16} {self.tried[entry]:>8} {self.accepted[entry]:>9} {self.refusals(entry):>8}  "
                         f"{ref}{mark}")
        total = sum(self.tried.values())
        lines.append(f"{'total':<16} {total:>8} {sum(self.accepted.values()):>9} "
                     f"{sum(self.refusals(e) for e in self.tried):>8}")
        for kind, label in (("undocumented", "undocumented"), ("corruption", "corruptions")):
            lines.append(f"{label:<16} {len(self.failures[kind]):>8}")
        for kind, items in self.failures.items():
            for item in items[:10]:
                lines.append(f"  {kind}: {item}")
        return "\n".join(lines)

    def ok(self) -> bool:
        return not any(self.failures.values())


def _call(tally, entry, fn):
    """Runs fn; returns (accepted, exception). Undocumented exceptions are counted."""
    tally.tried[entry] += 1
    try:
        fn()
    except DOCUMENTED as e:
        tally.refused[entry][type(e).__name__] += 1
        return False, e
    except Exception as e:  # noqa: BLE001 - what the fuzzer is for
        tally.refused[entry][type(e).__name__] += 1
        tally.fail("undocumented", entry, f"{type(e).__name__}: {e}"[:300])
        return False, e
    tally.accepted[entry] += 1
    return True, None


# ---- inputs

def _grad(rng: random.Random, n: int) -> torch.Tensor:
    """Finite values, sometimes at the edges of fp32's range or in blocks of subnormals."""
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    x = torch.randn(n, generator=g) * 10.0 ** rng.uniform(-6, 6)
    kind = rng.random()
    if kind < 0.15:
        x[rng.randrange(n)] = rng.choice([3.4e38, -3.4e38, 1e38, 6e4, 7e4])
    elif kind < 0.25:
        x[: min(n, 64)] *= 1e-40
    elif kind < 0.3:
        x.fill_(0.0)
    return x


def _mutate(rng: random.Random, p: torch.Tensor, varsize: bool):
    """A mutated copy of payload p, and whether a receiver must refuse it (a checked header
    field changed, or it was cut)."""
    q = p.clone()
    n = q.numel()
    kind = rng.random()
    if kind < 0.45:  # one header byte
        at = rng.randrange(min(HEADER, n))
        old = int(q[at])
        new = rng.choice([0, 0xFF, old ^ (1 << rng.randrange(8)), rng.randrange(256)])
        q[at] = new
        if new == old:
            return q, False
        if at == FLAG_BYTE:
            return q, (old ^ new) != 1
        return q, not (varsize and at in BODY_FIELD)
    if kind < 0.85:  # body bytes
        for _ in range(rng.randint(1, 8)):
            if n > HEADER:
                at = rng.randrange(HEADER, n)
                q[at] = rng.randrange(256)
        return q, False
    if kind < 0.95:  # cut short: refused unless only padding went
        keep = rng.randrange(n)
        body = int.from_bytes(bytes(p[24:28].tolist() + p[22:24].tolist()), "little")
        return q[:keep].clone(), keep < HEADER + body
    return torch.cat([q, torch.zeros(16, dtype=torch.uint8)]), False  # longer than written


def fuzz_decompress(tally, rng, method, cfg, count):
    s = _C.State(method, cfg)
    n = rng.choice([1, 7, 64, 513, 1000])
    world = rng.choice([1, 2, 3])
    p = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
    w = s.compress(_grad(rng, n), p, world=world)
    p = p[:w].clone()
    varsize = bool(s.flags["varsize"])
    for _ in range(count):
        q, must_refuse = _mutate(rng, p, varsize)
        acc = torch.randn(n)
        before = acc.clone()
        ok, err = _call(tally, "decompress", lambda: s.decompress(q, acc, world=world))
        if ok and must_refuse:
            tally.fail("corruption", "decompress", f"{method} {cfg}: accepted a header corruption")
        if not ok and "header" in str(err) and not torch.equal(acc, before):
            tally.fail("corruption", "decompress", f"{method} {cfg}: refused header touched acc")


def _snapshot(state):
    c = state.counters()
    # times, and the memory held (grow-only scratch and buffers may grow before a refusal: no state)
    keep = {k: v for k, v in c.items()
            if not k.endswith("_s") and k not in ("scratch_bytes", "buffer_bytes", "buffer_peak_bytes")}
    res = [None if r is None else r.clone() for r in state._core.residuals()]
    return keep, state._core.units(), state._core.step, state._core.cursor, res


def _same(a, b) -> bool:
    if a[:4] != b[:4]:
        return False
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a[4], b[4]))


def fuzz_decode(tally, rng, method, cfg, count):
    """The collective's decode at W = 2: rank 1's payload for rank 0 mutated in flight."""
    world = 2
    n = rng.choice([16, 130, 1000])
    states = [fsdpcomp.CommState(method, cfg) for _ in range(world)]
    grads = [_grad(rng, n) for _ in range(world)]
    units = [s._core.begin(n) for s in states]
    send_splits, _ = states[1]._core.plan(grads[1], world, 1)
    send = torch.empty(sum(send_splits), dtype=torch.uint8)
    sizes = states[1]._core.encode(grads[1], send, world, 1, units[1])
    payload = send[:sizes[0]].clone()
    varsize = bool(states[0]._core.flags["varsize"])
    out = torch.full((n // world,), 7.0)
    per_peer = states[0]._core.per_peer_ok(n, world)
    for _ in range(count):
        q, must_refuse = _mutate(rng, payload, varsize)
        snap = _snapshot(states[0])
        o = out.clone()
        ok, _ = _call(tally, "decode", lambda: states[0]._core.decode(q, grads[0], o, world, 0, units[0]))
        if ok and must_refuse:
            tally.fail("corruption", "decode", f"{method} {cfg}: accepted a header corruption")
        if not ok and (not _same(_snapshot(states[0]), snap) or not torch.equal(o, out)):
            tally.fail("corruption", "decode", f"{method} {cfg}: a refusal changed state or output")
        if per_peer:  # the same payload, hostile or not, through decode_part: the same verdict
            part = out.clone()
            states[0]._core.decode_part(torch.empty(0, dtype=torch.uint8), grads[0], part, world, 0,
                                        units[0], 0, 0)
            okp, _ = _call(tally, "decode_part",
                           lambda: states[0]._core.decode_part(q, grads[0], part, world, 0, units[0], 1, 0))
            if okp != ok:
                tally.fail("corruption", "decode_part",
                           f"{method} {cfg}: decode_part {'took' if okp else 'refused'} what decode "
                           f"{'took' if ok else 'refused'}")
            elif okp and must_refuse:
                tally.fail("corruption", "decode_part", f"{method} {cfg}: accepted a header corruption")


CONFIG_VALUES = [None, True, False, 0, 1, -1, 7, 8, 64, 255, 256, 2**24, 2**31, 2**63 - 1, 2**64, -2**70,
                 0.0, -0.0, 1e-3, 0.5, 1.5, 1e30, 1e300, float("nan"), float("inf"), "", "fp32",
                 "bf16", "zero", "pass", "e5m2", "minmax", "sign", "int8", "nc\x00", "bf16\x00x",
                 "\udcff", [], [1], {}, {"a": 1}, (1,)]


def _random_config(rng, method):
    info = fsdpcomp.method_info(method)
    keys = [k["name"] for k in info["keys"] + info["common_keys"]]
    cfg = {}
    for _ in range(rng.randint(0, 4)):
        r = rng.random()
        key = rng.choice(keys) if r < 0.8 else rng.choice(["blocksize", "", "seed\x00", "k\x00x", 3, None])
        if rng.random() < 0.5 and isinstance(key, str) and key in keys:
            k = next(k for k in info["keys"] + info["common_keys"] if k["name"] == key)
            if k["type"] == "choice":
                val = rng.choice(k["choices"])
            elif k["type"] == "bool":
                val = rng.random() < 0.5
            elif k["type"] == "int":
                val = rng.choice([int(k["min"]), int(min(k["max"], 2**62)), int(k["default"])])
            else:
                val = rng.choice([k["min"], k["max"], k["default"], 0.1])
        else:
            val = rng.choice(CONFIG_VALUES)
        cfg[key] = val
    return cfg


def _mutate_text(rng, text):
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        at = rng.randrange(len(chars) + 1)
        if op < 0.4 and chars:
            del chars[min(at, len(chars) - 1)]
        elif op < 0.8:
            chars.insert(at, rng.choice('{}[]":,0123456789.eE-+ \x00\\nulltrue'))
        else:
            chars.insert(at, rng.choice(["[" * 5000, '{"a":' * 3000, "\ud800", "1e999"]))
    return "".join(chars)


def fuzz_configs(tally, rng, method, count):
    for _ in range(count):
        cfg = _random_config(rng, method)
        ok, _ = _call(tally, "config", lambda: fsdpcomp.CommState(method, cfg))
        if rng.random() < 0.3:
            try:
                text = json.dumps(cfg)
            except (TypeError, ValueError):
                text = "{}"
            bad = _mutate_text(rng, text)
            _call(tally, "config_json", lambda: fsdpcomp.CommState(method, bad))
        if ok:  # an accepted config keeps finite values finite through a round trip
            s = _C.State(method, cfg)
            x = _grad(rng, 300)
            p = torch.zeros(s.payload_bytes(300), dtype=torch.uint8)
            acc = torch.zeros(300)
            okr, _ = _call(tally, "roundtrip", lambda: (s.compress(x, p), s.decompress(p, acc)))
            if okr and not torch.isfinite(acc).all():
                tally.fail("corruption", "roundtrip", f"{method} {cfg}: finite in, non-finite out")


def _bad_tensor(rng, n):
    """A tensor argument that is wrong in some way (or right, now and then)."""
    kind = rng.randrange(12)
    if kind == 0:
        return torch.randn(n, dtype=torch.float64)
    if kind == 1:
        return torch.randint(0, 5, (n,))
    if kind == 2:
        return torch.randn(2 * n)[::2]
    if kind == 3:
        return torch.randn(n)._neg_view()
    if kind == 4:
        return torch.empty(n, device="meta")
    if kind == 5:
        return [0.0] * n
    if kind == 6:
        return torch.randn(n, requires_grad=True)
    if kind == 7:
        return torch.randn(max(1, n - rng.randint(1, 5)))
    if kind == 8:
        return torch.empty(0)
    if kind == 9:
        return torch.zeros(n, dtype=torch.bool)
    if kind == 10:
        return torch.randn(n).bfloat16()
    return torch.randn(n)


def fuzz_tensors(tally, rng, method, cfg, count):
    """encode, decode, compress and reduce_scatter with wrong tensors, units and ranks; a
    refusal leaves the whole state as it was."""
    n = 256
    state = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
    state.reduce_scatter(torch.randn(n), torch.empty(n))
    state.end_step()
    core = state._core
    plan = sum(core.plan(torch.empty(n), 1, 0)[0])
    for _ in range(count):
        unit = core.begin(n) if rng.random() < 0.7 else rng.choice([0, 5, -1, 2**40])
        g = _bad_tensor(rng, n) if rng.random() < 0.6 else torch.randn(n)
        out = _bad_tensor(rng, n) if rng.random() < 0.5 else torch.empty(n)
        send = torch.empty(plan, dtype=torch.uint8) if rng.random() < 0.7 else _bad_tensor(rng, plan)
        world, rank = rng.choice([(1, 0), (1, 0), (1, 0), (2, 5), (0, 0), (2000, 1)])
        for entry, fn in (("encode", lambda: core.encode(g, send, world, rank, unit)),
                          ("decode", lambda: core.decode(send, g, out, world, rank, unit))):
            snap = _snapshot(state)
            ok, _ = _call(tally, entry, fn)
            if not ok and not _same(_snapshot(state), snap):
                tally.fail("corruption", entry, f"{method} {cfg}: a refusal changed state")
            if not ok:
                break
        # compress: a valid call (its payload buffer, arguments in range) about half the time,
        # else a wrong tensor, a short buffer or an argument out of range
        m = rng.choice([1, 7, n, 1000])
        need = core.payload_bytes(m)
        x = torch.randn(m) if rng.random() < 0.6 else _bad_tensor(rng, m)
        r = rng.random()
        p = (torch.empty(need + rng.choice([0, 0, 16]), dtype=torch.uint8) if r < 0.6 else
             torch.empty(max(0, need - rng.randint(1, 40)), dtype=torch.uint8) if r < 0.75 else _bad_tensor(rng, need))
        kw = rng.choice([{}, {"unit": 3, "chunk": 5, "world": 3, "rank": 1}, {"world": 2, "rank": 1},
                         {"world": 0}, {"world": 2, "rank": 2}, {"unit": -1}, {"chunk": 2**40}])
        snap = _snapshot(state)
        ok, _ = _call(tally, "compress", lambda: core.compress(x, p, **kw))
        if not ok and not _same(_snapshot(state), snap):
            tally.fail("corruption", "compress", f"{method} {cfg}: a refusal changed state")
        state.end_step()
        # the Python entry point with tensors of the unit's size (a refused call claiming a unit
        # first, wrong sizes and non-tensor arguments: tests/distributed/test_refusals.py and
        # tests/core/test_bad_input.py)
        g2 = g if isinstance(g, torch.Tensor) and g.numel() == n else torch.randn(n)
        o2 = out if isinstance(out, torch.Tensor) and out.numel() == n else torch.empty(n)
        _call(tally, "reduce_scatter", lambda: state.reduce_scatter(g2, o2))
        state.end_step()


def fuzz_restore(tally, rng, method, cfg, count):
    state = fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True))
    for _ in range(2):
        state.reduce_scatter(torch.randn(300), torch.empty(300))
        state.end_step()
    good = state.state_dict()
    own = good["rank0"]
    for _ in range(count):
        sd = dict(good)
        mine = dataclasses.replace(own, residuals={slot: [None if r is None else r.clone() for r in table]
                                                   for slot, table in own.residuals.items()})
        kind = rng.randrange(9)
        scatter = mine.residuals["scatter"]
        if kind == 0 and scatter and scatter[0] is not None:
            scatter[0][rng.randrange(300)] = rng.choice([float("nan"), float("inf"), -float("inf")])
        elif kind == 1:
            sd["step"] = rng.choice([-1, 2**32, 2**32 + 3, 2**70, 1.5, "3", None, True, 2**32 - 1, 0])
        elif kind == 2:
            mine.units = rng.choice([[-1], [2**60], ["a"], [300, 300], [], [300.0], "x"])
        elif kind == 3:
            mine.residuals = rng.choice([{"scatter": [torch.zeros(5)]}, {"scatter": [torch.zeros(300, dtype=torch.float64)]},
                                         {"scatter": [torch.zeros(300)] * 3}, {"scatter": [None]}, "x",
                                         {"gather": [torch.full((150,), float("nan"))]}, {"other": []},
                                         {"factors": "x"}, [torch.zeros(300)]])
        elif kind == 4:
            sd["config"] = rng.choice([good["config"].replace('"seed": ', '"seed": 1'), "{", "[]", 3])
        elif kind == 5:
            mine.unit_states = rng.choice([[torch.full((4,), float("nan"))], [torch.zeros(3)], "x", [1]])
        elif kind == 6:
            sd["world_size"] = rng.choice([2, 0, None, "1"])
        elif kind == 7:
            sd["format"] = rng.choice([1, 3, "2", None])
        else:
            sd.pop(rng.choice(list(sd)))
        if "rank0" in sd:
            sd["rank0"] = mine
        snap = _snapshot(state)
        ok, _ = _call(tally, "load_state_dict", lambda: state.load_state_dict(sd))
        if not ok and not _same(_snapshot(state), snap):
            tally.fail("corruption", "load_state_dict", f"{method}: a refusal changed state")
        if ok:
            state.load_state_dict(good)
            state._step_open = False


def run(seconds=None, per_method=40, seed=0, log=None):
    """Runs every generator over every method config, `per_method` inputs each (or until
    `seconds` have passed, cycling); returns the Tally."""
    rng = random.Random(seed)
    tally = Tally()
    deadline = None if seconds is None else time.monotonic() + seconds
    rounds = 0
    while True:
        for method, cfg in METHOD_CASES:
            for name, fn in (("decompress", lambda: fuzz_decompress(tally, rng, method, cfg, per_method)),
                             ("decode", lambda: fuzz_decode(tally, rng, method, cfg, per_method)),
                             ("configs", lambda: fuzz_configs(tally, rng, method, max(1, per_method // 4))),
                             ("tensors", lambda: fuzz_tensors(tally, rng, method, cfg, max(1, per_method // 8))),
                             ("restore", lambda: fuzz_restore(tally, rng, method, cfg, max(1, per_method // 8)))):
                if log is not None:
                    log.write(f"round {rounds} {name} {method} {cfg}\n")
                    log.flush()
                fn()
            if deadline is not None and time.monotonic() > deadline:
                return tally
        rounds += 1
        if deadline is None:
            return tally


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per_method", type=int, default=40, help="inputs per generator and method per round")
    ap.add_argument("--log", default=None, help="file naming the case in progress (for a crash)")
    args = ap.parse_args()
    faulthandler.enable()
    torch.set_num_threads(1)
    log = open(args.log, "w") if args.log else None
    t0 = time.monotonic()
    tally = run(args.seconds, args.per_method, args.seed, log)
    print(f"fuzz: seed {args.seed}, {time.monotonic() - t0:.0f} s, fsdpcomp {fsdpcomp.__version__} "
          f"({os.path.dirname(fsdpcomp.__file__)})")
    print(tally.table())
    print("crashes: 0 (the process ran to its end)")
    sys.exit(0 if tally.ok() else 1)


if __name__ == "__main__":
    main()
