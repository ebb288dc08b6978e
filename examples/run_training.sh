#!/usr/bin/env bash
# torchrun wrapper for fsdp_train.py: NPROC ranks (default: GPUs, else 2), extra flags passed through.
#   NPROC=2 examples/run_training.sh --model tiny --max_steps 30 --comm_compress int8
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(torch.cuda.device_count() or 2)")
fi
exec python -m torch.distributed.run --standalone --nproc_per_node="$NPROC" "$here/fsdp_train.py" "$@"
