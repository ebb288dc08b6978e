"""GPU checks, group `driver` (tests/gpu/run.sh driver, ~2 min): the CUDA driver itself: 300
calls on one State without reading counters, event timing of torch.distributed collectives,
counters() waiting without the GIL, the sampled-statistics rule against the CPU's, and the NCCL
communicator's life: release and reuse, a dropped one, one left at exit, a peer that never
joins (the init deadline)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import torch

import fsdpcomp
from fsdpcomp import _C
from gpu_common import CheckFailed, need_real_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fail_unless(ok: bool, message: str, detail=None):
    if not ok:
        raise CheckFailed(message, detail)


def check_300_calls_without_counters():
    """The defect of harvest(): with the GPU kept behind (a sleep kernel before every call), the
    event ring wraps while its pairs are still running, so cudaEventQuery answers NotReady; that
    code must not reach the next launch check. 300 encode + decode calls, then counters()."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    n, calls = 1 << 20, 300
    st = fsdpcomp.CommState("int8", {"compress_own_chunk": True, "error_feedback": True})
    g = torch.randn(n, device="cuda")
    s, _ = st._core.plan(g, 1, 0)
    send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
    out = torch.empty(n, device="cuda")
    t0 = time.perf_counter()
    for i in range(calls):
        torch.cuda._sleep(200_000)  # ~0.1 ms of GPU time per call: the host runs ahead
        unit = st._core.begin(n)
        st._core.encode(g, send, 1, 0, unit)
        st._core.decode(send, g, out, 1, 0, unit)
        st.end_step()
    enqueue_s = time.perf_counter() - t0
    c = st.counters()
    detail = {k: c[k] for k in ("calls", "bytes_sent", "error_samples", "compress_time_s",
                                "decompress_time_s", "grad_rel_error", "residual_norm")}
    detail["host_enqueue_s"] = round(enqueue_s, 3)
    _fail_unless(c["calls"] == calls, f"calls {c['calls']}, expected {calls}", detail)
    _fail_unless(c["bytes_sent"] == calls * sum(s), "bytes_sent is not calls x payload", detail)
    _fail_unless(c["error_samples"] == -(-calls // 8), f"error_samples {c['error_samples']}, expected "
                 f"{-(-calls // 8)} (error_stats_every 8)", detail)
    _fail_unless(c["compress_time_s"] > 0 and c["decompress_time_s"] > 0, "no event time harvested", detail)
    _fail_unless(0 < c["grad_rel_error"] < 0.02, "int8's relative error is off", detail)
    # and the State goes on: another 70 calls, counters again
    for i in range(70):
        unit = st._core.begin(n)
        st._core.encode(g, send, 1, 0, unit)
        st.end_step()
    _fail_unless(st.counters()["calls"] == calls + 70, "calls after 70 more", detail)
    return detail


def check_comm_time_is_device_time():
    """A collective issued from Python on CUDA tensors is timed by events on the stream: a GPU
    sleep of 10^8 cycles standing in for it counts its ~50 ms although the host returns at once."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    st = fsdpcomp.CommState("int8", {})
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    cycles = 100_000_000  # ~50 ms at a 2 GHz clock, ~70 ms at 1.4 GHz
    t0 = time.perf_counter()
    st._exchange.timed(lambda t: torch.cuda._sleep(cycles), x)
    st._exchange.timed(lambda t: torch.cuda._sleep(cycles), x, bytes_sent=100, extra=True)
    host = time.perf_counter() - t0
    c = st.counters()
    detail = {"comm_time_s": c["comm_time_s"], "extra_collective_time_s": c["extra_collective_time_s"],
              "extra_collectives": c["extra_collectives"], "host_s": round(host, 4), "cycles": cycles}
    _fail_unless(c["comm_time_s"] > 0.04 and host < c["comm_time_s"] / 2,
                 "comm_time_s does not hold the device time", detail)
    _fail_unless(c["extra_collective_time_s"] > 0.02 and c["extra_collectives"] == 1,
                 "the extra collective is not counted as one", detail)
    _fail_unless(c["comm_time_s"] > c["extra_collective_time_s"], "extra time not part of comm time", detail)
    _fail_unless(c["bytes_sent"] == 100, "bytes_sent of the extra collective", detail)
    return detail


def check_counters_wait_without_the_gil():
    """counters() waits for the GPU (2 s of sleep queued) with the GIL released: another thread
    runs meanwhile, and a call into the same State from it is refused as busy, not deadlocked."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    st = fsdpcomp.CommState("int8", {"compress_own_chunk": True})
    g = torch.randn(4096, device="cuda")
    s, _ = st._core.plan(g, 1, 0)
    send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
    st._core.encode(g, send, 1, 0, st._core.begin(4096))
    torch.cuda._sleep(int(3e9))  # ~2 s on a 1.5-2 GHz clock
    ticks, busy = [0], []

    def other():
        t_end = time.time() + 1.0
        while time.time() < t_end:
            ticks[0] += 1
        try:
            st._core.plan(g, 1, 0)
        except RuntimeError as e:
            busy.append(str(e))

    th = threading.Thread(target=other)
    t0 = time.perf_counter()
    th.start()
    time.sleep(0.05)
    st.counters()
    waited = time.perf_counter() - t0
    th.join()
    detail = {"waited_s": round(waited, 3), "other_thread_ticks": ticks[0], "busy_refusals": busy}
    _fail_unless(waited > 0.5, "counters() did not wait for the GPU (the test's sleep was too short?)", detail)
    _fail_unless(ticks[0] > 1000, "the other thread did not run while counters() waited", detail)
    _fail_unless(len(busy) == 1 and "in use" in busy[0], "a call from the other thread was not refused as busy", detail)
    return detail


def check_sampled_statistics_follow_the_cpu_rule():
    """With NaN in the first chunk sent, the sample is the next finite chunk's (as on the CPU),
    with and without error feedback; error_samples equal, grad_rel_error and grad_cos_sim close."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    gen, out = torch.Generator().manual_seed(6), {}
    for ef in (False, True):
        cfg = {"error_feedback": ef, "error_stats_every": 1}
        cpu, gpu = fsdpcomp.CommState("int8", cfg), fsdpcomp.CommState("int8", cfg)
        for step in range(4):
            g = torch.randn(3000, generator=gen)
            if step % 2 == 0:
                g[1500] = float("nan")  # chunk 1 of 3: the first one rank 0 sends
            for st, dev in ((cpu, "cpu"), (gpu, "cuda")):
                gg = g.to(dev)
                s, _ = st._core.plan(gg, 3, 0)
                st._core.encode(gg, torch.empty(sum(s), dtype=torch.uint8, device=dev), 3, 0, st._core.begin(3000))
                st.end_step()
        a, b = cpu.counters(), gpu.counters()
        row = {k: (a[k], b[k]) for k in ("error_samples", "grad_rel_error", "grad_cos_sim", "nonfinite_in")}
        out[f"error_feedback={ef}"] = row
        _fail_unless(a["error_samples"] == b["error_samples"] == 4, "error_samples differ", out)
        _fail_unless(a["nonfinite_in"] == b["nonfinite_in"] == 2, "nonfinite_in differ", out)
        for k in ("grad_rel_error", "grad_cos_sim"):
            _fail_unless(abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])), f"{k} differs", out)
    return out


def _python(code: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def check_nccl_release_and_reuse():
    """transport nccl at world 1 (self send/recv): reduce-scatters, release_nccl(), a call after
    it makes a new communicator, release again; the released one raises NcclError if used."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    st = fsdpcomp.CommState("int8", {"transport": "nccl", "compress_own_chunk": True})
    g = torch.randn(10000, device="cuda")
    out = torch.empty(10000, device="cuda")
    for _ in range(3):
        st.reduce_scatter(g, out)
        st.end_step()
    old = fsdpcomp._nccl.comm_for(None, g.device)
    released = fsdpcomp.release_nccl()
    st.reduce_scatter(g, out)  # a new communicator
    st.end_step()
    torch.cuda.synchronize()
    s, _ = st._core.plan(g, 1, 0)
    send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
    try:
        st._core.nccl_all_to_all(old, send, torch.empty_like(send), s, s)
        used_after_release = "no error"
    except fsdpcomp.NcclError as e:
        used_after_release = str(e)
    again = fsdpcomp.release_nccl()
    c = st.counters()
    detail = {"released": released, "released_again": again, "used_after_release": used_after_release,
              "comm_time_s": c["comm_time_s"], "calls": c["calls"],
              "max_abs_err": float((out - g).abs().max())}
    _fail_unless(released == 1 and again == 1, "release_nccl did not release one communicator each time", detail)
    _fail_unless("released" in used_after_release, "a released communicator did not raise NcclError", detail)
    _fail_unless(c["comm_time_s"] > 0 and c["calls"] == 4, "the all-to-alls were not timed or counted", detail)
    _fail_unless(detail["max_abs_err"] < 0.05, "the reduce-scatter through NCCL is wrong", detail)
    return detail


def check_nccl_dropped_and_exit_are_local():
    """An unreleased communicator dropped while running is aborted locally (returns at once), and
    one still alive at exit is left to the process's exit (exit 0, no hang)."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    code = ("import time, torch, fsdpcomp\n"
            "from fsdpcomp import _C\n"
            "c = _C.nccl_comm_init(_C.nccl_unique_id(), 1, 0, 0, 30.0)\n"
            "t0 = time.time(); del c; print('dropped_s', round(time.time() - t0, 3))\n"
            "st = fsdpcomp.CommState('int8', {'transport': 'nccl', 'compress_own_chunk': True})\n"
            "g = torch.randn(1000, device='cuda'); o = torch.empty(1000, device='cuda')\n"
            "st.reduce_scatter(g, o); torch.cuda.synchronize(); print('left for exit')\n")
    t0 = time.time()
    r = _python(code, 120)
    detail = {"rc": r.returncode, "seconds": round(time.time() - t0, 1), "stdout": r.stdout[-500:],
              "stderr": r.stderr[-1500:]}
    _fail_unless(r.returncode == 0 and "left for exit" in r.stdout, "the process did not exit cleanly", detail)
    return detail


def check_nccl_peer_that_never_joins_times_out():
    """nccl_comm_init for 2 ranks with only this one joining: NcclError after timeout_s (5 s),
    not a hang (the non-blocking init's deadline)."""
    need_real_gpu("the driver on a device (streams, events, NCCL)")
    code = ("import time, fsdpcomp\n"
            "from fsdpcomp import _C\n"
            "t0 = time.time()\n"
            "try:\n"
            "    _C.nccl_comm_init(_C.nccl_unique_id(), 2, 0, 0, 5.0)\n"
            "    print('RESULT no error')\n"
            "except fsdpcomp.NcclError as e:\n"
            "    print('RESULT NcclError', round(time.time() - t0, 1), e)\n")
    r = _python(code, 150)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT")), "")
    detail = {"rc": r.returncode, "result": line, "stderr": r.stderr[-1500:]}
    _fail_unless(line.startswith("RESULT NcclError") and "joined" in line,
                 "a missing peer did not end in NcclError naming the timeout", detail)
    return detail
