"""GPU checks, group `train` (tests/gpu/run.sh train, ~3-6 min): one-GPU training through an NCCL
process group (world 1) with `compress_own_chunk`, so that every rank's payload is really encoded,
exchanged and decoded: FSDP1 (fsdp_hook), FSDP2 (ReduceScatter) and DDP (ddp_hook), each with
every method that has CUDA kernels; the codec's cost per step of gpt2-62m under FSDP2 (int8 and
`param_gather` int8); then a short run of the real examples/fsdp_train.py. Each run's losses and
counters go into the summary (its `training` rows).

At world 1 torch's FSDP2 copies instead of calling a custom reduce-scatter (foreach_reduce in
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), so the FSDP2 check also calls the
installed fsdpcomp.ReduceScatter itself, on CUDA tensors, as FSDP2 does at world > 1."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import fsdpcomp
from gpu_common import CheckFailed, Skip, cuda_methods, need_real_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 8
# the step-cost check: the reference model, one GPU's batch, and few steps (the train group's cap:
# most of the check's time is the interpreter, transformers and the model's first step)
COST_MODEL, COST_BATCH, COST_SEQ, COST_WARMUP, COST_STEPS = "gpt2-62m", 8, 1024, 2, 4


@contextlib.contextmanager
def one_rank_nccl():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda()


def _wrap(parallel: str, model, method, cfg):
    """The model under `parallel`, and the CommState fsdpcomp.register attached (None: plain)."""
    if parallel == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=torch.cuda.current_device(), use_orig_params=True)
    elif parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)
        fully_shard(model)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[torch.cuda.current_device()])
    state = fsdpcomp.register(model, method, cfg) if method else None
    return model, state


def _train(parallel: str, method, cfg) -> dict:
    model, state = _wrap(parallel, _model(), method, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(256, 64, device="cuda", generator=g)
    y = torch.randn(256, 8, device="cuda", generator=g)
    losses, t0 = [], time.perf_counter()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    row = {"losses": [round(v, 6) for v in losses], "seconds": round(time.perf_counter() - t0, 3)}
    if state is not None:
        c = state.counters()
        row["counters"] = {k: c[k] for k in ("calls", "ratio", "bytes_sent", "comm_time_s", "compress_time_s",
                                              "decompress_time_s", "grad_rel_error", "grad_cos_sim",
                                              "nonfinite_in", "nonfinite_out")}
        row["state"] = state
    return row


def _every_method(parallel: str) -> dict:
    need_real_gpu("training through NCCL on a GPU")
    rows, bad = [], []
    with one_rank_nccl():
        base = _train(parallel, None, None)["losses"]
        for method in cuda_methods():
            where = f"{parallel} {method}"
            row = {"parallel": parallel, "method": method}
            try:
                r = _train(parallel, method, {"compress_own_chunk": True})
            except Exception as e:  # noqa: BLE001 - one run's failure is one row
                row.update(status="failed", error=f"{type(e).__name__}: {e}")
                rows.append(row)
                bad.append(f"{where}: {row['error']}")
                continue
            state = r.pop("state")
            row.update(r)
            losses, c = r["losses"], r["counters"]
            problems = []
            if not all(v == v and abs(v) != float("inf") for v in losses):
                problems.append("non-finite loss")
            elif losses[-1] >= losses[0]:
                problems.append(f"loss did not fall ({losses[0]} -> {losses[-1]})")
            if method == "none" and parallel != "fsdp2" and max(
                    abs(a - b) for a, b in zip(losses, base)) > 1e-5 * abs(base[0]):
                problems.append("`none` does not train as the uncompressed baseline")
            if parallel != "fsdp2" and c["calls"] == 0:
                problems.append("the hook was never called")
            if parallel == "fsdp2":
                row["direct_reduce_scatter"] = _direct_reduce_scatter(state, problems)
            row["status"] = "failed" if problems else "passed"
            if problems:
                row["problems"] = problems
                bad.extend(f"{where}: {p}" for p in problems)
            rows.append(row)
    detail = {"baseline_losses": [round(v, 6) for v in base], "runs": rows}
    if bad:
        raise CheckFailed(f"{len(bad)} problem(s): " + "; ".join(bad[:10]), detail)
    return detail


def _direct_reduce_scatter(state, problems) -> dict:
    """fsdpcomp.ReduceScatter on CUDA tensors, called as FSDP2 calls it at world > 1."""
    rs = fsdpcomp.ReduceScatter(state)
    inp = torch.randn(4099, device="cuda")  # world 1: the input is the output
    out = rs.allocate((4099,), dtype=torch.float32, device=inp.device)
    before = state.counters()["calls"]
    rs(out, inp, group=dist.group.WORLD, op=dist.ReduceOp.AVG)
    state.end_step()
    err = float((out - inp).abs().max() / inp.abs().max())
    calls = state.counters()["calls"] - before
    if calls != 1 or not torch.isfinite(out).all():
        problems.append(f"direct ReduceScatter: {calls} calls, max relative error {err:.3g}")
    return {"calls": calls, "max_rel_err": round(err, 6)}


def check_fsdp1_every_method():
    """FSDP1 (one GPU: NO_SHARD, the hook's all-reduce meaning) with every CUDA method."""
    return _every_method("fsdp1")


def check_fsdp2_every_method():
    """FSDP2 (fully_shard) with every CUDA method, plus ReduceScatter called directly."""
    return _every_method("fsdp2")


def check_ddp_every_method():
    """DDP (ddp_hook; the first iteration is the uncompressed warm-up) with every CUDA method."""
    return _every_method("ddp")


def step_cost(device: str, preset: str, batch: int, seq: int, warmup: int, steps: int) -> dict:
    """gpt2 `preset` under FSDP2 (each block and the model fully_shard'ed) on one rank of the
    current process group, with fsdpcomp int8 and param_gather int8 registered: the step's time
    and the codec's per step. At world 1 torch's FSDP2 calls no collective (it copies), so after
    each step the check drives what FSDP2 calls at world > 1 itself, through the registered
    classes: every FSDP module's gradients through a ReduceScatter (compress_own_chunk: encoded and
    decoded) and its parameters through an AllGather twice (the forward gather and the backward
    re-gather). The codec times are the States' counters (on CUDA, device time by events): the
    gradient State's compress/decompress and the parameter codec's; the step is timed around
    forward, backward and optimizer step (synchronized), without the driven codec work."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import gpt
    from torch.distributed.fsdp import fully_shard
    from fsdpcomp.integrations.fsdp2 import AllGather, ReduceScatter, _param_groups, fsdp2_modules

    torch.manual_seed(0)
    with torch.device(device):
        model = gpt.make_model(gpt.make_config(preset))
    params = gpt.n_params(model)
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    state = fsdpcomp.register(model, "int8", {"compress_own_chunk": True, "param_gather": "int8"})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    modules = fsdp2_modules(model)
    driven = [(ReduceScatter(state, key=name or "<root>", module=m), AllGather(state, unit=i, module=m),
               [p.sharded_param for p in (_param_groups(m)[0].fsdp_params if _param_groups(m) else [])])
              for i, (name, m) in enumerate(modules)]
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randint(0, model.config.vocab_size, (batch, seq), device=device, generator=g)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    def codec_work():
        for rs, ag, ps in driven:
            if not ps:
                continue
            grad = torch.cat([p.grad.to_local().reshape(-1) for p in ps])
            rs(rs.allocate((grad.numel(),), dtype=grad.dtype, device=grad.device), grad,
               group=dist.group.WORLD, op=dist.ReduceOp.AVG)
            shard = torch.cat([p.to_local().detach().reshape(-1) for p in ps])
            for _ in range(2):  # the forward gather and the backward re-gather
                ag(ag.allocate((shard.numel(),), dtype=shard.dtype, device=shard.device), shard,
                   group=dist.group.WORLD)
        state.end_step()

    def times():
        c, p = state.counters(), state.param_codec.counters()  # on CUDA: waits for the device
        return [c["compress_time_s"], c["decompress_time_s"], p["compress_time_s"], p["decompress_time_s"],
                c["param_gather_codec_time_s"], c["calls"], c["param_gather_calls"]]

    step_s, losses = 0.0, []
    for i in range(warmup + steps):
        if i == warmup:
            start = times()
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        sync()
        if i >= warmup:
            step_s += time.perf_counter() - t0
        losses.append(round(loss.item(), 4))
        codec_work()
    end = times()
    d = [(b - a) for a, b in zip(start, end)]
    ms = [1e3 * v / steps for v in d[:5]]
    codec_ms = sum(ms[:4])
    return {"model": preset, "params": params, "batch": batch, "seq": seq, "method": "int8", "param_gather": "int8",
            "warmup_steps": warmup, "timed_steps": steps, "losses": losses, "step_ms": 1e3 * step_s / steps,
            "grad_encode_ms": ms[0], "grad_decode_ms": ms[1], "param_encode_ms": ms[2], "param_decode_ms": ms[3],
            "param_gather_host_ms": ms[4], "codec_ms": codec_ms,
            "codec_share_of_step": codec_ms / (1e3 * step_s / steps) if step_s > 0 else None,
            "grad_calls_per_step": d[5] / steps, "param_gathers_per_step": d[6] / steps,
            "how": (f"Mean of {steps} steps after {warmup} warm-up steps. At world 1 FSDP2 calls no collective, so "
                    "each step's gradients and parameters were sent through fsdpcomp's ReduceScatter and "
                    "AllGather (two gathers per module) by the check, as FSDP2 calls them at world > 1; the codec "
                    "times are the States' counters (device time, CUDA events); the step (forward, backward, "
                    "AdamW, fp32) is timed around itself, without that driven work.")}


def check_step_cost_gpt2_62m():
    """The codec's milliseconds per step of gpt2-62m (FSDP2, int8, param_gather int8,
    compress_own_chunk) beside the step's (step_cost)."""
    need_real_gpu("the step cost on a GPU")
    try:
        import transformers  # noqa: F401 - examples/gpt.py builds GPT-2 with it
    except ImportError:
        raise Skip("transformers is not installed (examples/gpt.py builds GPT-2 with it)")
    with one_rank_nccl():
        d = step_cost("cuda", COST_MODEL, COST_BATCH, COST_SEQ, COST_WARMUP, COST_STEPS)
    problems = []
    if not all(v == v and abs(v) != float("inf") for v in d["losses"]):
        problems.append(f"non-finite loss: {d['losses']}")
    if d["grad_calls_per_step"] < 1 or d["param_gathers_per_step"] < 2:
        problems.append(f"the driven codec work did not run: {d['grad_calls_per_step']} reduce-scatters and "
                        f"{d['param_gathers_per_step']} gathers per step")
    if not (d["grad_encode_ms"] > 0 and d["grad_decode_ms"] > 0 and d["param_encode_ms"] > 0 and d["param_decode_ms"] > 0):
        problems.append("a codec time is 0: the counters did not see the device's work")
    if problems:
        raise CheckFailed("; ".join(problems), d)
    return d


WORDS = ["gradient", "compression", "sharded", "training", "over", "slow", "links", "with", "fsdp"]


def write_text_data(path: str, docs: int = 3000) -> None:
    """A .txt file of `docs` distinct documents (paragraphs: blank-line separated, as
    examples/textdata.py reads them), so that the 5% validation split fsdp_train.py holds out of
    --data_path by a hash of each document has ~150 of them (one paragraph would land wholly on
    one side, and the run fail for want of training or validation data)."""
    with open(path, "w") as f:
        for i in range(docs):
            words = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12 + i % 9))
            f.write(f"document {i}: {words}\n\n")


def check_examples_fsdp_train():
    """The real examples/fsdp_train.py (GPT-2 `tiny`, 6 steps, FSDP1 and FSDP2, int8 with
    compress_own_chunk) on a small text file; its results.jsonl rows."""
    need_real_gpu("training through NCCL on a GPU")
    try:
        import transformers  # noqa: F401 - the example's GPT-2 comes from it
    except ImportError:
        raise Skip("transformers is not installed (examples/gpt.py builds GPT-2 with it)")
    rows, bad = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.txt")
        write_text_data(data)
        for parallel in ("fsdp1", "fsdp2"):
            out = os.path.join(tmp, parallel)
            cmd = [sys.executable, os.path.join(ROOT, "examples", "fsdp_train.py"), "--model", "tiny",
                   "--max_steps", "6", "--parallel", parallel, "--data_path", data, "--output_dir", out,
                   "--eval_batches", "2", "--comm_compress", "int8", "--comm_config_json",
                   json.dumps({"compress_own_chunk": True, "error_feedback": True})]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k, None)
            t0 = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
            row = {"parallel": parallel, "rc": r.returncode, "seconds": round(time.time() - t0, 1)}
            results = os.path.join(out, "results.jsonl")
            if r.returncode == 0 and os.path.exists(results):
                with open(results) as f:
                    rec = json.loads(f.readlines()[-1])
                row.update({k: rec.get(k) for k in ("train_loss", "val_ppl", "compression_ratio",
                                                    "compress_time_ms", "comm_time_ms_total", "tokens_per_s",
                                                    "grad_rel_error", "device")})
            else:
                row["stderr"] = r.stderr[-3000:]
                bad.append(f"{parallel}: exit {r.returncode}")
            rows.append(row)
    if bad:
        raise CheckFailed("; ".join(bad), {"runs": rows})
    return {"runs": rows}
