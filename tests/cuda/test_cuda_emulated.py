"""The CUDA library's driver and kernels run on the CPU: cuda/*.cu compiled as C++ against a host
emulation of the CUDA runtime (tests/cuda_emu: a host thread per CUDA thread, warp shuffles as
barriers of the warp's lanes), then the checks of tests/cuda/test_cuda.py against the CPU path at
small sizes. It proves the kernels' logic (indexing, block reductions in the CPU's order,
packing, draws, residuals, decode, corrupt codes) without a GPU; what only a GPU shows (timing,
the memory model, NaN bits of the hardware's own arithmetic) is left to tests/gpu/run.sh."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import (DTYPES, NEEDS_HOST, check_decode, check_encode, check_sum_order, cpu_encode, cpu_payloads,
                                cuda_cases, make_grad)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu"))
import build as emu_build  # noqa: E402

if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
    pytest.skip("no C++ compiler for the CUDA emulation", allow_module_level=True)

# byte offsets in fc_cuda_ws (csrc/backend_cuda/fc_cuda.h)
WS_NONFINITE_IN, WS_NONFINITE_OUT, WS_PAYLOAD_ERROR, WS_SATURATED = 0, 8, 48, 64
# a one-pass encode's per-call part (enc_ticket .. enc_sum) to the struct's end: left zero by every
# encode, so that the next one needs no memset (cuda/fc_cu_onepass.cuh)
WS_ENC_SCRATCH, WS_SIZE = 36968, 65656
FC_PAYLOAD_CODES = 8


@pytest.fixture(scope="module")
def emu():
    out = os.environ.get("FSDPCOMP_EMU_DIR") or os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}")
    os.makedirs(out, exist_ok=True)
    return Emulated(emu_build.build(out))


def ws_counts(ws: bytes) -> dict:
    """The counters of an emulated call's fc_cuda_ws."""
    return {"nonfinite_in": struct.unpack_from("<Q", ws, WS_NONFINITE_IN)[0],
            "nonfinite_out": struct.unpack_from("<Q", ws, WS_NONFINITE_OUT)[0],
            "saturated": struct.unpack_from("<Q", ws, WS_SATURATED)[0]}


def check_scratch_left_zero(ws: bytes, where: str) -> None:
    """The workspace's per-call part after an encode or compress(): every ticket, flag and sum the
    call used is zero again (the emulator's workspace starts zeroed, as the State's does)."""
    assert len(ws) == WS_SIZE, f"fc_cuda_ws is {len(ws)} bytes, the test's offsets are for {WS_SIZE}"
    left = [i for i in range(WS_ENC_SCRATCH, WS_SIZE) if ws[i]]
    assert not left, f"{where}: the encode left its scratch set at byte offsets {left[:8]}"


def align16(v: int) -> int:
    return (v + 15) // 16 * 16


COMMON_KEYS = set(fsdpcomp.CommState("none", {}).config)  # the keys every method takes


class EmuState:
    """What the C module keeps per State for the CUDA path, on the host: config, step, units,
    residuals (fc_cuda_path.c's job)."""

    def __init__(self, method: str, cfg: dict):
        self.method, self.cfg = method, cfg
        self.core = fsdpcomp.CommState(method, cfg)._core  # config resolution and sizes only
        info = fsdpcomp.method_info(method)
        self.id = info["id"]
        self.cfg_bytes = self.core._config_bytes  # the parsed config struct, as the library gets it
        conf = self.core.config
        self.ef = bool(conf["error_feedback"])
        self.res_dtype = torch.float32 if conf["residual_dtype"] == "fp32" else torch.bfloat16
        self.step, self.calls, self.res, self.saturated = 0, 0, None, 0

    def wire(self, grad: torch.Tensor, world: int, rank: int) -> "EmuState":
        """The state whose method a unit's payloads go out with (fc_core_wire_method): this one,
        or `none` where the method's payloads would be no smaller than none's. The plan is the
        wire method's, so it shows which (a fallback's plan is none's, and only then)."""
        if self.method == "none":
            return self
        plain = EmuState("none", {k: v for k, v in self.cfg.items() if k in COMMON_KEYS})
        sends, _ = self.core.plan(grad, world, rank)
        return plain if sum(sends) > 0 and sends == plain.core.plan(grad, world, rank)[0] else self


class Emulated:
    def __init__(self, exe: str):
        self.exe = exe

    def state(self, method: str, cfg: dict) -> EmuState:
        return EmuState(method, cfg)

    def end_step(self, st: EmuState) -> None:
        st.step += 1

    def residual(self, st: EmuState):
        return st.res

    def saturated(self, st: EmuState) -> int:
        return st.saturated

    @staticmethod
    def body(st: EmuState, n: int, dtype: torch.dtype) -> int:
        """Body bytes of a chunk of n (fc_cuda_path.c's body_bytes)."""
        if n == 0:
            return 0
        if st.method == "none":  # the gradient's own dtype on the wire
            return n * torch.empty(0, dtype=dtype).element_size()
        lay = st.core.layout(n)
        return lay["value_bytes"] + lay["meta_bytes"] + lay["index_bytes"]

    def geometry(self, st: EmuState, n: int, world: int, rank: int, dtype: torch.dtype) -> dict:
        per = -(-n // world)
        last = n - (n - 1) // per * per
        bf, bl = self.body(st, per, dtype), self.body(st, last, dtype)
        return {"numel": n, "world": world, "rank": rank, "skip_own": int(not st.core.config["compress_own_chunk"]),
                "pay_full": align16(32 + bf), "body_full": bf, "pay_last": align16(32 + bl), "body_last": bl}

    def run(self, mode: str, st: EmuState, args: dict, files: dict) -> tuple[str, bytes]:
        with tempfile.TemporaryDirectory() as d:
            for name, t in files.items():
                with open(os.path.join(d, name), "wb") as f:
                    f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
            with open(os.path.join(d, "args.txt"), "w") as f:
                f.write(f"method {st.id}\n")
                f.write(f"cfg {st.cfg_bytes.hex()}\n")
                for k, v in args.items():
                    f.write(f"{k} {v}\n")
            r = subprocess.run([self.exe, mode, d], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"emulated {mode} failed: {r.stderr.strip()}")
            outs = {}
            for name in os.listdir(d):
                with open(os.path.join(d, name), "rb") as f:
                    outs[name] = f.read()
            return outs

    def encode(self, st: EmuState, grad: torch.Tensor, world: int, rank: int) -> torch.Tensor:
        n = grad.numel()
        conf = st.core.config
        w = st.wire(grad, world, rank)  # as `none`: no residual, no sample (fc_cuda_path.c)
        ef = st.ef and w is st
        sends, _ = st.core.plan(grad, world, rank)
        args = dict(self.geometry(w, n, world, rank, grad.dtype), gdt=DTYPES[grad.dtype], rdt=-1,
                    send_bytes=sum(sends), unit=0, step=st.step, seed=conf["seed"],
                    nonfinite_zero=int(conf["nonfinite"] == "zero"), fingerprint=st.core.fingerprint,
                    ef_decay=conf["ef_decay"],  # the driver's fc_cuda_encode_args.ef_decay
                    sample=int(w is st and conf["error_stats_every"] > 0 and st.calls % conf["error_stats_every"] == 0))
        files = {"grad.bin": grad}
        if ef:
            if st.res is None:
                st.res = torch.zeros(n, dtype=st.res_dtype)
            args["rdt"] = DTYPES[st.res_dtype]
            files["res.bin"] = st.res
        outs = self.run("encode", w, args, files)
        check_scratch_left_zero(outs["ws.bin"], f"{st.method} encode")
        st.calls += 1
        st.saturated += struct.unpack_from("<Q", outs["ws.bin"], WS_SATURATED)[0]
        if ef:
            st.res = torch.frombuffer(bytearray(outs["res.bin"]), dtype=torch.uint8).view(st.res_dtype).clone()
        return torch.frombuffer(bytearray(outs["send.bin"]), dtype=torch.uint8).clone()

    def decode(self, method: str, cfg: dict, recv: torch.Tensor, grad: torch.Tensor, out_numel: int,
               world: int, rank: int, expect_error: bool = False):
        n = grad.numel()
        configured = EmuState(method, cfg)
        st = configured.wire(grad, world, rank)
        own = -(-n // world)
        own = max(0, min(own, n - rank * own))
        args = dict(self.geometry(st, n, world, rank, grad.dtype), gdt=DTYPES[grad.dtype], odt=DTYPES[grad.dtype],
                    out_numel=out_numel, slot=align16(32 + self.body(st, own, grad.dtype)) if own else 0,
                    unit=0, step=0, seed=st.core.config["seed"], fingerprint=configured.core.fingerprint,
                    nonfinite_zero=int(st.core.config["nonfinite"] == "zero"))
        outs = self.run("decode", st, args, {"recv.bin": recv, "grad.bin": grad})
        out = torch.frombuffer(bytearray(outs["out.bin"]), dtype=torch.uint8).view(grad.dtype).clone()
        ws = outs["ws.bin"]
        if expect_error:
            code, rank = struct.unpack_from("<Ii", ws, WS_PAYLOAD_ERROR)
            return out, code, rank
        assert struct.unpack_from("<I", ws, WS_PAYLOAD_ERROR)[0] == 0, "emulated decode reported a payload error"
        return out, ws_counts(ws)


# The methods with kernels in cuda/ (the emulation needs no nvcc, so not the build's "cuda" flag;
# test_emulated_table_is_the_source_list checks the list against the compiled table), but those
# that need the host glue (device scratch, unit state, data-dependent sizes): their cases run in
# test_cuda_sparse.py under test_cuda_files_emulated.py, through the real _C.
CASES = cuda_cases(sorted(set(fsdpcomp._CUDA_METHODS) - NEEDS_HOST))
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in CASES]


def test_emulated_table_is_the_source_list(emu):
    r = subprocess.run([emu.exe, "methods", "-"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ids = {fsdpcomp.method_info(m)["id"]: m for m in fsdpcomp.codecs()}
    assert {ids[int(i)] for i in r.stdout.split()} == set(fsdpcomp._CUDA_METHODS)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("world,rank,dtype,res", [(1, 0, torch.float32, "fp32"), (3, 1, torch.bfloat16, "bf16"),
                                                  (4, 3, torch.float16, "fp32")])
def test_emulated_encode_matches_cpu(emu, method, cfg, world, rank, dtype, res, gen):
    for n in (1, 255, 257, 2053):
        check_encode(emu, method, cfg, dtype, max(world, 1), rank, max(n, world), gen, residual_dtype=res)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_emulated_encode_of_nonfinite_matches_cpu(emu, method, cfg, mode, gen):
    for world, rank, n in ((1, 0, 255), (3, 0, 1031)):
        check_encode(emu, method, cfg, torch.float32, world, rank, n, gen, nonfinite=mode)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emulated_encode_without_error_feedback_matches_cpu(emu, method, cfg, dtype, gen):
    """The lean one-pass kernels (no residual, no sample, an fp32 or bf16 gradient: the second
    call) and the general one without a residual (the first call, sampled): the CPU's bytes, with
    NaN/Inf passed or zeroed, a chunk below a tile and chunks of many."""
    for world, rank, n, nonfinite in ((3, 1, 1031, "pass"), (4, 2, 3 * 2053, "zero"), (2, 0, 9, None)):
        check_encode(emu, method, cfg, dtype, world, rank, n, gen, nonfinite=nonfinite, ef=False)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_emulated_encode_of_tiny_and_huge_values_matches_cpu(emu, method, cfg, gen):
    for scale in (1e-40, 1e-37, 1e30):
        check_encode(emu, method, cfg, torch.float32, 3, 1, 1031, gen, scale=scale)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_emulated_encode_near_the_largest_values_matches_cpu(emu, method, cfg, gen):
    """Values near each dtype's largest: g + e beyond fp32, codes, residuals and casts that
    saturate (docs/methods.md, "Range and NaN"), over three steps of error feedback."""
    for dtype, res in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp32")):
        check_encode(emu, method, cfg, dtype, 3, 1, 1031, gen, residual_dtype=res, huge=True, steps=3)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_emulated_decode_of_overflowing_and_nonfinite_sums_matches_cpu(emu, method, cfg, gen):
    """Sums of W decodes beyond fp32 saturate unless an input brought NaN/Inf: the own chunk
    ("pass" passes it, "zero" adds 0) or a payload flagged by its sender."""
    check_decode(emu, method, cfg, torch.float32, 3, 1, 1031, gen, huge=True)
    check_decode(emu, method, cfg, torch.bfloat16, 4, 0, 777, gen, huge=True)
    check_decode(emu, method, cfg, torch.float32, 3, 2, 1031, gen, huge=True, own_nonfinite=True)
    check_decode(emu, method, cfg, torch.float32, 3, 2, 1031, gen, huge=True, own_nonfinite=True, mode="zero")
    check_decode(emu, method, cfg, torch.float32, 3, 0, 1031, gen, huge=True, nonfinite=True, mode="zero")


FUSED = [("none", {}), ("bf16", {}), ("fp16", {}), ("int8", {}), ("fp8", {"block_size": 8}), ("intN", {"bits": 3}),
         ("qsgd", {"levels": 1000, "bucket_size": 8}), ("nc", {}), ("onebit", {"block_size": 8})]


@pytest.mark.parametrize("method,cfg", FUSED, ids=[m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in FUSED])
def test_emulated_fused_decode_over_a_grid_smaller_than_its_runs(emu, method, cfg, gen):
    """The fused decode (cuda/fc_cu_decode.cuh) sizes its grid to the device, and the emulated one
    holds four blocks of 256 threads (2 SMs of 2, tests/cuda_emu/cuda_runtime.h): an own chunk of
    20001 elements (1251 runs of 16) takes all four, each checking every header itself, and loops.
    The own chunk then starts 4 bytes past a 16-byte boundary (narrower loads of the own values),
    its last run is cut (the element-wise path), blocks of 8 put two scales in one run; at W=3 the
    codes lie at any alignment the layout gives and NaN/Inf come from the own chunk and a payload."""
    check_decode(emu, method, cfg, torch.float32, 2, 1, 2 * 20001, gen, huge=True)
    check_decode(emu, method, cfg, torch.bfloat16, 3, 2, 3 * 6000 - 7, gen, nonfinite=True, own_nonfinite=True)


def test_emulated_fused_decode_rejects_a_header_in_every_block(emu, gen):
    """A payload for another world size, among the runs of four blocks: the whole own chunk is NaN
    (no block decodes what another rejected), FSDP's tail stays zero, and the rejection is the
    workspace's payload error (counters() raises it), with its rank."""
    cfg = {"compress_own_chunk": False}
    n, world = 2 * 20001, 2
    grads = [make_grad(n, torch.float32, gen) for _ in range(world)]
    st = fsdpcomp.CommState("int8", cfg)
    send = cpu_encode(st, grads[0], world, 0, st._core.begin(n))
    bad = send[-st._core.plan(grads[0], world, 0)[0][1]:].clone()  # rank 0's payload to rank 1
    bad[6] ^= 0x01  # the header's world
    out, code, rank = emu.decode("int8", cfg, bad, grads[1], 20001 + 5, world, 1, expect_error=True)
    assert (code, rank) == (FC_PAYLOAD_WORLD, 0)
    assert torch.isnan(out[:20001]).all() and torch.equal(out[20001:], torch.zeros(5))


@pytest.mark.parametrize("method", ["none", "bf16", "int8"])
def test_emulated_own_nan_passes_at_its_own_element_only(emu, method):
    """The output rule per element (fc_output_passes), on the device as on the CPU: the own
    chunk's NaN passes at its element, the other elements' overflow of finite terms (3e38 + 3e38,
    the payload's header not flagged) saturates at fp32's largest value."""
    cfg = {"compress_own_chunk": False}
    grads = [torch.full((64,), 3e38), torch.full((64,), 3e38)]
    grads[1][40] = float("nan")  # rank 1's own chunk is [32, 64)
    recv = cpu_payloads(method, cfg, grads, 2, 1)
    out, counts = emu.decode(method, cfg, recv, grads[1], 32, 2, 1)
    want = torch.full((32,), torch.finfo(torch.float32).max)
    want[8] = float("nan")
    assert torch.equal(out.view(torch.int32), want.view(torch.int32)), out
    assert (counts["nonfinite_in"], counts["nonfinite_out"], counts["saturated"]) == (1, 1, 31)


SINGLE = ("none", "fp16", "bf16", "int8", "fp8", "intN", "qsgd", "nc", "onebit")  # single-payload kernels
SINGLE_CASES = [(m, c) for m, c in CASES if m in SINGLE]


@pytest.mark.parametrize("method,cfg", SINGLE_CASES, ids=[IDS[CASES.index(c)] for c in SINGLE_CASES])
def test_emulated_compress_and_decompress_match_cpu(emu, method, cfg, gen):
    """State.compress/decompress (the all-gather half, parameter gathers): one payload, its
    header (fingerprint, NONFINITE flag) and body the CPU's, and acc += alpha * decode."""
    for n, chunk, world, rank, kind in ((700, 2, 3, 1, ""), (1031, 0, 2, 0, "nonfinite"), (1031, 1, 4, 3, "huge")):
        x = make_grad(n, torch.float32, gen, nonfinite=kind == "nonfinite", huge=kind == "huge")
        st = fsdpcomp.CommState(method, dict(cfg, seed=99))
        buf = torch.zeros(st._core.payload_bytes(n), dtype=torch.uint8)
        w = st._core.compress(x, buf, unit=5, chunk=chunk, world=world, rank=rank)
        est = EmuState(method, dict(cfg, seed=99))
        body = Emulated.body(est, n, torch.float32)
        geo = {"numel": n, "per": n, "world": world, "skip_own": 0, "pay_full": align16(32 + body),
               "body_full": body, "pay_last": align16(32 + body), "body_last": body, "unit": 5, "step": 0,
               "chunk": chunk, "seed": 99, "fingerprint": st._core.fingerprint}
        outs = emu.run("compress", est, dict(geo, rank=rank, send_bytes=buf.numel()), {"grad.bin": x})
        check_scratch_left_zero(outs["ws.bin"], f"{method} compress")
        got = torch.frombuffer(bytearray(outs["send.bin"]), dtype=torch.uint8)
        where = f"{method} {cfg} n={n} {kind}"
        assert torch.equal(got, buf[:w]), f"{where}: payload bytes differ at {(got != buf[:w]).nonzero()[:8].flatten().tolist()}"
        acc = torch.randn(n, generator=gen)
        want = acc.clone()
        st._core.decompress(buf[:w], want, alpha=-0.5, unit=5, chunk=chunk, world=world)
        outs = emu.run("decompress", est, dict(geo, rank=0, alpha=-0.5), {"recv.bin": buf[:w], "grad.bin": acc})
        dec = torch.frombuffer(bytearray(outs["out.bin"]), dtype=torch.float32)
        assert torch.equal(dec.view(torch.int32), want.view(torch.int32)), f"{where}: decode differs"


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_emulated_loopback_decode_matches_cpu(emu, method, cfg, gen):
    check_decode(emu, method, cfg, torch.float32, 4, 2, 1029, gen)
    check_decode(emu, method, cfg, torch.bfloat16, 3, 0, 777, gen, nonfinite=True, compress_own=True)
    check_decode(emu, method, cfg, torch.float32, 1, 0, 5, gen, compress_own=True)


@pytest.mark.parametrize("cfg", [{}, {"block_size": 32}, {"block_size": 64}, {"block_size": 1024}])
def test_emulated_block_sums_take_the_cpu_order(emu, cfg, gen):
    check_sum_order(emu, cfg, gen)


# A code no encoder writes, per method with such codes: (config, byte offset in the body, value)
CORRUPT = {
    "intN": ({"bits": 2}, 4, 0xFF),          # code 3 > 2 * qmax
    "qsgd": ({"levels": 2}, 4, 0xFF),        # level 3 > 2 (width 3)
    "nc": ({}, 4, 0x80),                     # a signed zero code
}


@pytest.mark.parametrize("method", sorted(CORRUPT))
def test_emulated_decode_reports_impossible_codes(emu, method, gen):
    cfg, off, val = CORRUPT[method]
    cfg = dict(cfg, compress_own_chunk=True)
    g = make_grad(64, torch.float32, gen)
    st = fsdpcomp.CommState(method, cfg)
    send = cpu_encode(st, g, 1, 0, st._core.begin(64))
    send[32 + off] = val
    with pytest.raises(fsdpcomp.PayloadError):
        st._core.decode(send, g, torch.empty(64), 1, 0, 0)
    out, code, rank = emu.decode(method, cfg, send, g, 64, 1, 0, expect_error=True)
    assert code == FC_PAYLOAD_CODES and rank == 0
    assert torch.isnan(out).any()


FC_PAYLOAD_CONFIG, FC_PAYLOAD_WORLD = 9, 10


@pytest.mark.parametrize("field,offset,code", [("fingerprint", 28, FC_PAYLOAD_CONFIG), ("world", 6, FC_PAYLOAD_WORLD)])
def test_emulated_decode_checks_the_header_as_the_cpu_does(emu, field, offset, code, gen):
    """Wire version 3's fields on the device: a payload of another config (fingerprint) or for
    another world size is rejected (its outputs NaN, the code for counters() to raise), as the
    CPU raises PayloadError; flipping the NONFINITE flag alone is accepted on both."""
    cfg = {"compress_own_chunk": True}
    g = make_grad(300, torch.float32, gen)
    st = fsdpcomp.CommState("int8", cfg)
    send = cpu_encode(st, g, 1, 0, st._core.begin(300))
    bad = send.clone()
    bad[offset] ^= 0x01
    with pytest.raises(fsdpcomp.PayloadError, match="config" if field == "fingerprint" else "world"):
        st._core.decode(bad, g, torch.empty(300), 1, 0, 0)
    out, got, rank = emu.decode("int8", cfg, bad, g, 300, 1, 0, expect_error=True)
    assert (got, rank) == (code, 0) and torch.isnan(out).all(), field
    flagged = send.clone()
    flagged[5] |= 0x01  # FC_HDR_NONFINITE: the sum passes NaN/Inf, none here
    out, counts = emu.decode("int8", cfg, flagged, g, 300, 1, 0)
    want = torch.empty(300)
    ref = fsdpcomp.CommState("int8", cfg)
    ref._core.decode(flagged, g, want, 1, 0, ref._core.begin(300))
    assert torch.equal(out, want) and counts["nonfinite_out"] == 0


CODEC_CASES = [(m, c) for m, c in CASES if m in ("int8", "fp8", "intN", "qsgd", "nc", "onebit")]  # fc_cu_codecs.cuh's


@pytest.mark.parametrize("method,cfg", CODEC_CASES, ids=[IDS[CASES.index(c)] for c in CODEC_CASES])
def test_emulated_codec_on_an_array_matches_cpu(emu, method, cfg, gen):
    """fc_cu_codecs.cuh as a sparsifier's value codec uses it: an fp32 array (no residual) into
    the body State.compress writes for it with the same stream, and acc += alpha * decode."""
    for n, chunk, world, rank in ((1, 0, 1, 0), (700, 2, 3, 1), (2100, 1, 4, 3)):
        x = make_grad(n, torch.float32, gen)
        st = fsdpcomp.CommState(method, dict(cfg, seed=99))
        buf = torch.zeros(st._core.payload_bytes(n), dtype=torch.uint8)
        w = st._core.compress(x, buf, unit=5, chunk=chunk, world=world, rank=rank)
        acc = torch.randn(n, generator=gen)
        want = acc.clone()
        st._core.decompress(buf[:w], want, alpha=-0.5, unit=5, chunk=chunk, world=world)
        est = EmuState(method, dict(cfg, seed=99))
        outs = emu.run("array", est, {"seed": 99, "unit": 5, "chunk": chunk, "rank": rank, "alpha": -0.5,
                                      "body_bytes": Emulated.body(est, n, torch.float32)},
                       {"x.bin": x, "acc.bin": acc})
        got = torch.frombuffer(bytearray(outs["body.bin"]), dtype=torch.uint8)
        assert torch.equal(got, buf[32:32 + got.numel()]), f"{method} {cfg} n={n}: body bytes differ"
        dec = torch.frombuffer(bytearray(outs["acc.bin"]), dtype=torch.float32)
        assert torch.equal(dec.view(torch.int32), want.view(torch.int32)), f"{method} {cfg} n={n}: decode differs"
