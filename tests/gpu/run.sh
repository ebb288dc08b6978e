#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks CI cannot run: build with CUDA, the CUDA tests, the kernel
# tests under compute-sanitizer memcheck, and the kernel benchmark. Run from the repo root on a
# machine with a GPU and a CUDA build of torch:  bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.__version__, torch.cuda.get_device_name())"
# In place, so the other checkouts of this repo are not shadowed; NCCL headers from the wheel
# torch already depends on, when installed.
FSDPCOMP_CUDA=1 FSDPCOMP_CUDA_ARCHS="${FSDPCOMP_CUDA_ARCHS:-$(python -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())')}" \
    python setup.py build_ext --inplace
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -m pytest tests/test_cuda.py tests/test_cuda_build.py -q -rs
if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 1 --target-processes all \
        python -m pytest tests/test_cuda.py -q -x -k "encode or loopback or corrupt"
else
    echo "compute-sanitizer not found: memcheck skipped" >&2
fi
python benchmarks/kernels_cuda.py --sizes 16M,64M,256M
