"""GPU checks, group `driver` (tests/gpu/run.sh driver, ~2 min): the CUDA driver itself: 300
calls on one State without reading counters, event timing of torch.distributed collectives,
counters() waiting without the GIL, and the sampled-statistics rule against the CPU's."""
from __future__ import annotations

import threading
import time

import torch

import fsdpcomp
from gpu_common import CheckFailed, need_real_gpu


def _fail_unless(ok: bool, message: str, detail=None):
    if not ok:
        raise CheckFailed(message, detail)


def check_300_calls_without_counters():
    """The defect of harvest(): with the GPU kept behind (a sleep kernel before every call), the
    event ring wraps while its pairs are still running, so cudaEventQuery answers NotReady; that
    code must not reach the next launch check. 300 encode + decode calls, then counters()."""
    need_real_gpu("the driver on a device (streams, events)")
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
    need_real_gpu("the driver on a device (streams, events)")
    st = fsdpcomp.CommState("int8", {})
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    cycles = 100_000_000  # ~50 ms at a 2 GHz clock, ~70 ms at 1.4 GHz
    t0 = time.perf_counter()
    st._reducer.exchange.timed(lambda t: torch.cuda._sleep(cycles), x)
    st._reducer.exchange.timed(lambda t: torch.cuda._sleep(cycles), x, bytes_sent=100, extra=True)
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
    need_real_gpu("the driver on a device (streams, events)")
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
    need_real_gpu("the driver on a device (streams, events)")
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
