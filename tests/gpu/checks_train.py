"""GPU checks, group `train` (tests/gpu/run.sh train, ~3-6 min): one-GPU training through an NCCL
process group (world 1) with `compress_own_chunk`, so that every rank's payload is really encoded,
exchanged and decoded: FSDP1 (fsdp_hook), FSDP2 (ReduceScatter) and DDP (ddp_hook), each with
every method that has CUDA kernels; then a short run of the real examples/fsdp_train.py. Each
run's losses and counters go into the summary (its `training` rows).

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
