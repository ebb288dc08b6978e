#!/usr/bin/env bash
# torchrun wrapper for fsdp_train.py: NPROC ranks (default: GPUs, else 2), extra flags passed through.
#   NPROC=2 examples/run_training.sh --model tiny --max_steps 30 --comm_compress int8
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(torch.cuda.device_count() or 2)")
fi
# The ranks share this machine's cores. torchrun would set OMP_NUM_THREADS=1 itself and print a
# banner saying so; a fair share per rank is what the script uses on the CPU anyway.
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
  cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  export OMP_NUM_THREADS=$(( cores / NPROC > 0 ? cores / NPROC : 1 ))
fi
exec python -m torch.distributed.run --standalone --nproc_per_node="$NPROC" "$here/fsdp_train.py" "$@"
