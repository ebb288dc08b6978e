"""Runs a function on W real processes joined by a gloo process group, and collects what each
rank returns. Every multi-process test goes through here."""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, outdir, fn, args, pg_timeout_s=None):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # W ranks share 2 cores
    # Rendezvous through a file, not a TCPStore: with a TCPStore, rank 0 hosts the server and
    # leaving while a peer still talked to it aborted rank 0 now and then ("terminate called
    # without an active exception"), even after a barrier. A FileStore has no server thread.
    timeout = {} if pg_timeout_s is None else {"timeout": datetime.timedelta(seconds=pg_timeout_s)}
    dist.init_process_group("gloo", init_method="file://" + os.path.join(outdir, "store"), rank=rank,
                            world_size=world, **timeout)
    try:
        result = fn(rank, world, *args)
        torch.save({"ok": result}, os.path.join(outdir, f"{rank}.pt"))
        if pg_timeout_s is None:  # a group that timed out cannot even say goodbye
            dist.barrier()  # tear down together
    except BaseException:
        torch.save({"error": traceback.format_exc()}, os.path.join(outdir, f"{rank}.pt"))
        raise
    finally:
        dist.destroy_process_group()
    # Leave without interpreter finalization. Even after destroy_process_group, a C++ thread of
    # torch's (gloo's or the intra-op pool's) was now and then still joinable when static
    # destructors ran, and std::terminate aborted a rank whose result was already saved (CI,
    # test_fsdp1_train, "terminate called without an active exception"). What the test checks
    # is in the result file; nothing after this point is. Under the sanitizers (.ci/sanitize)
    # this also skips LeakSanitizer's exit check in the ranks, on purpose: there it reported
    # what torch's c10d flight recorder and CPython's finalisation leave behind (traceback
    # frames of every collective, constants of imported code; a different few dozen objects
    # each run, with allocation stacks too short to suppress by name). ASan and UBSan still stop
    # a rank at the first error, and the leak check runs in the test process, which drives the
    # same C code single-process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def _sanitized_ranks():
    """Under .ci/sanitize: the ranks spawned in here unwind fast and skip the exit-time leak check
    (they leave with os._exit, see _entry). The test process unwinds every malloc slowly so that
    .ci/lsan.supp can name the frames of what CPython and numpy keep for good; in a rank, which
    imports torch afresh, that made one test take 105 s instead of 8."""
    saved = os.environ.get("ASAN_OPTIONS")
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        os.environ["ASAN_OPTIONS"] = (saved or "") + ":fast_unwind_on_malloc=1:detect_leaks=0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ASAN_OPTIONS", None)
        else:
            os.environ["ASAN_OPTIONS"] = saved


def run_ranks(fn, world: int, *args, timeout: float = 300.0, pg_timeout_s: float | None = None) -> list:
    """fn(rank, world, *args) on `world` spawned processes; returns [result of rank 0, ...].
    fn must be a module-level function (it is pickled by name). pg_timeout_s: the process
    group's timeout (torch's default otherwise); with it the ranks skip the closing barrier."""
    with tempfile.TemporaryDirectory() as outdir, _sanitized_ranks():
        ctx = mp.start_processes(_entry, args=(world, outdir, fn, args, pg_timeout_s), nprocs=world,
                                 join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=timeout):
                pass
        except mp.ProcessRaisedException as e:
            raise AssertionError(f"a rank failed:\n{e}") from None
        results = []
        for r in range(world):
            data = torch.load(os.path.join(outdir, f"{r}.pt"), weights_only=False)
            if "error" in data:
                raise AssertionError(f"rank {r} failed:\n{data['error']}")
            results.append(data["ok"])
        return results
