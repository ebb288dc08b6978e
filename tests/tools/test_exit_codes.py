"""Jobs that end right after one of fsdpcomp's collectives exit with their own status: 1 after
an fsdpcomp error on every rank, 0 after a run that skips destroy_process_group; never a rank
killed by SIGABRT ("terminate called without an active exception": a gloo worker thread still
letting go of a collective's tensors while the interpreter finalized, fixed by fsdpcomp._dist's
settled collectives). Many short jobs, because the failure was a race (about 1 job in 8 for
`mismatch` before the fix, on this 2-core machine); the counts are in the assertion message.
The training example leaves no gloo thread running into the interpreter's finalization, where
the same abort hit about one CI run in fifty."""
import collections
import os
import re
import subprocess
import sys

import pytest

from helpers.dist_utils import free_port
from helpers.pkg_path import pythonpath
from helpers.train_utils import run_train, wordnet_subset

pytestmark = pytest.mark.slow
JOB = os.path.join(os.path.dirname(__file__), "..", "helpers", "exit_job.py")


def run_job(mode: str, world: int = 2) -> tuple[list[int], str]:
    """One job of `world` ranks (started as torchrun would): each rank's exit code, their stderr."""
    env = dict(os.environ, PYTHONPATH=pythonpath(), OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, JOB, mode], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    return [p.returncode for p in procs], "".join(errs)


@pytest.mark.parametrize("mode, want, says, jobs", [
    ("mismatch", 1, "ValueError: ranks disagree", 12),
    ("payload", 1, "PayloadError", 6),
    ("exchange", 0, None, 6),
])
def test_short_jobs_exit_with_their_own_status(mode, want, says, jobs):
    codes, aborted = collections.Counter(), []
    for _ in range(jobs):
        rcs, err = run_job(mode)
        codes.update(rcs)
        if "terminate called" in err or any(rc < 0 for rc in rcs):
            aborted.append(err[-2000:])
        elif says is not None:
            assert err.count(says) == 2, err[-3000:]  # every rank says what went wrong
    assert not aborted and codes == {want: 2 * jobs}, (dict(codes), aborted[:1])


@pytest.mark.parametrize("parallel", ["fsdp1", "ddp"])
def test_training_leaves_no_gloo_thread_at_exit(tmp_path, parallel):
    # FSDP1's reference cycles hold the process group past destroy_process_group; before the
    # example collected them, both gloo worker threads and gloo's TCP loop were still running
    # when main() returned, on every rank and every run. FSDP2 (plain torch, no fsdpcomp) keeps
    # its group until the process ends whatever is collected, so the example ends with os._exit.
    train, _ = wordnet_subset(str(tmp_path / "data"), 200, 4)
    proc = run_train(["--data_path", train, "--output_dir", str(tmp_path / "out"), "--parallel", parallel,
                      "--model", "tiny", "--batch_size", "2", "--max_length", "32", "--eval_batches", "1",
                      "--warmup_steps_discard", "0", "--max_steps", "2", "--comm_compress", "int8"],
                     script=os.path.join(os.path.dirname(JOB), "train_threads.py"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    left = re.findall(r"threads after main: (\[[^\]]*\])", proc.stderr)
    assert len(left) == 2, proc.stderr[-4000:]  # one list per rank
    assert not [line for line in left if "gloo" in line], left
