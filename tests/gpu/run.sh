#!/usr/bin/env bash
# tests/gpu/run.sh: everything of fsdpcomp that needs a GPU, in one command, written to one log
# and one JSON summary. Run from anywhere on a machine with a GPU, nvcc and a CUDA build of torch
# (no network needed: nothing is installed from outside):
#
#   bash tests/gpu/run.sh                 # all groups, in this order (~20-30 min)
#   bash tests/gpu/run.sh GROUP...        # some of them; each is well under 10 minutes:
#
#   build      ~1-2 min  build in place (FSDPCOMP_CUDA=1, this GPU's arch unless
#                        FSDPCOMP_CUDA_ARCHS is set), skipped when the build is newer than the
#                        sources; every other group builds first if needed
#   pytest     ~2-5 min  tests/cuda/test_cuda*.py under pytest (skipped without pytest)
#   bytes      ~3-6 min  payload bytes, residuals and decodes = the CPU's for every config of
#                        tests/helpers/method_cases.py of every method with CUDA kernels, at n = 1, 255,
#                        257, 2^20+3 and one case above 2^31 bytes; loopback decode of W payloads;
#                        single-payload compress/decompress (tests/gpu/checks_bytes.py)
#   driver     ~1-2 min  300 calls on one State without counters(), event-timed collectives,
#                        counters() without the GIL, the sampling rule, NCCL release / drop /
#                        exit / init timeout (tests/gpu/checks_driver.py)
#   sanitize   ~4-8 min  compute-sanitizer memcheck, racecheck and synccheck on
#                        tests/gpu/sanitize_run.py (also as groups memcheck, racecheck, synccheck)
#   train      ~3-6 min  one-GPU FSDP1, FSDP2 and DDP through an NCCL process group with
#                        compress_own_chunk, every CUDA method, transports torch and nccl; the
#                        real examples/fsdp_train.py (tests/gpu/checks_train.py)
#   bench      ~1-3 min  benchmarks/kernels_cuda.py: the kernel table
#
# Output: $FSDPCOMP_GPU_OUT, else $OUT/gpu when $OUT is set, else build/gpu: run.log (everything
# printed, appended) and summary.json (per check: passed / failed / skipped with the reason and
# seconds and details; the kernel table; the training rows), merged across invocations. A
# failing check never stops the others; the exit status is non-zero if any check of this
# invocation failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT_DIR="${FSDPCOMP_GPU_OUT:-}"
if [ -z "$OUT_DIR" ]; then
    if [ -n "${OUT:-}" ]; then OUT_DIR="$OUT/gpu"; else OUT_DIR="$ROOT/build/gpu"; fi
fi
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
exec > >(tee -a "$LOG") 2>&1
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
HARNESS="$ROOT/tests/gpu/harness.py"
FAILED=0

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(all)
expanded=()
for g in "${groups[@]}"; do
    case "$g" in
        all) expanded+=(build pytest bytes driver memcheck racecheck synccheck train bench) ;;
        sanitize) expanded+=(memcheck racecheck synccheck) ;;
        build|pytest|bytes|driver|memcheck|racecheck|synccheck|train|bench) expanded+=("$g") ;;
        *) echo "unknown group '$g' (all, build, pytest, bytes, driver, sanitize, memcheck, racecheck, synccheck, train, bench)"; exit 2 ;;
    esac
done

# record GROUP NAME STATUS REASON SECONDS [DETAIL_JSON_FILE]: one result into summary.json
record() {
    local detail="${6:-}"
    "$PY" - "$1" "$2" "$3" "$4" "$5" "$detail" "$OUT_DIR" "$HARNESS" <<'PYEOF'
import json, subprocess, sys
group, name, status, reason, seconds, detail_file, out, harness = sys.argv[1:9]
r = {"status": status, "seconds": float(seconds)}
if reason:
    r["reason" if status == "skipped" else "error"] = reason
if detail_file:
    try:
        with open(detail_file) as f:
            r["detail"] = json.load(f)
    except (OSError, ValueError) as e:
        r["detail"] = f"unreadable: {e}"
subprocess.run([sys.executable, harness, "--out", out, "--merge", group, name, json.dumps(r)], check=True)
PYEOF
    [ "$3" = failed ] && FAILED=1
    echo "== $1.$2: $3 ${4:+($4)}"
}

echo "==== tests/gpu/run.sh $(date -u +%FT%TZ): groups ${expanded[*]}; output $OUT_DIR"

env_info() {
    local t0=$SECONDS
    "$PY" - "$OUT_DIR/env.json" <<'PYEOF'
import json, os, shutil, subprocess, sys
import torch
info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(), "nvcc": shutil.which("nvcc") or os.environ.get("NVCC"),
        "compute_sanitizer": shutil.which("compute-sanitizer"), "cpus": os.cpu_count()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(device=torch.cuda.get_device_name(0), capability="%d%d" % torch.cuda.get_device_capability(0),
                memory_gib=round(p.total_memory / 2**30, 1), device_count=torch.cuda.device_count())
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:
        info["nccl"] = f"unknown ({e})"
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        timeout=30).stdout.strip()
except Exception:
    pass
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
sys.exit(0 if info["cuda_available"] else 3)
PYEOF
    local rc=$?
    if [ $rc -eq 0 ]; then
        record env info passed "" $((SECONDS - t0)) "$OUT_DIR/env.json"
    else
        record env info failed "torch sees no GPU (or torch failed to import)" $((SECONDS - t0)) "$OUT_DIR/env.json"
    fi
    return $rc
}

build_needed() {
    local lib="$ROOT/fsdpcomp/_fsdpcomp_cuda.so" c
    c=$(ls "$ROOT"/fsdpcomp/_C*.so 2>/dev/null | head -1)
    [ -f "$lib" ] && [ -n "$c" ] || return 0
    [ -n "$(find "$ROOT/csrc" "$ROOT/cuda" "$ROOT/setup.py" -newer "$lib" -print -quit)" ] && return 0
    [ -n "$(find "$ROOT/csrc" "$ROOT/cuda" "$ROOT/setup.py" -newer "$c" -print -quit)" ] && return 0
    return 1
}

BUILD_OK=""
BUILD_FAILED=""
do_build() {
    [ -n "$BUILD_OK" ] && return 0
    [ -n "$BUILD_FAILED" ] && return 1  # tried once in this invocation: not again per group
    local t0=$SECONDS
    if ! build_needed; then
        BUILD_OK=1
        [ "$1" = explicit ] && record build build skipped "the in-place build is newer than every source" 0
        return 0
    fi
    local archs="${FSDPCOMP_CUDA_ARCHS:-$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null)}"
    echo "---- build (archs ${archs:-setup.py default})"
    local env_archs=()
    [ -n "$archs" ] && env_archs=(FSDPCOMP_CUDA_ARCHS="$archs")
    if env FSDPCOMP_CUDA=1 "${env_archs[@]}" "$PY" setup.py build_ext --inplace; then
        BUILD_OK=1
        record build build passed "" $((SECONDS - t0))
    else
        BUILD_FAILED=1
        record build build failed "setup.py build_ext --inplace failed (see run.log)" $((SECONDS - t0))
        return 1
    fi
}

run_pytest() {
    local t0=$SECONDS
    if ! "$PY" -c "import pytest" 2>/dev/null; then
        record pytest cuda_tests skipped "pytest is not installed here" 0
        return
    fi
    local files=(tests/cuda/test_cuda.py tests/cuda/test_cuda_build.py tests/cuda/test_cuda_geometry.py)
    [ -f tests/cuda/test_cuda_driver.py ] && files+=(tests/cuda/test_cuda_driver.py)
    # the sparse, aggregate and stateful methods' single payloads (compress/decompress)
    [ -f tests/cuda/test_cuda_single.py ] && files+=(tests/cuda/test_cuda_single.py)
    echo "---- pytest ${files[*]}"
    "$PY" -m pytest "${files[@]}" -q -rs -p no:cacheprovider --junitxml="$OUT_DIR/pytest.xml"
    local rc=$?
    if [ $rc -eq 0 ]; then
        record pytest cuda_tests passed "" $((SECONDS - t0))
    else
        record pytest cuda_tests failed "pytest exit $rc (see run.log, pytest.xml)" $((SECONDS - t0))
    fi
}

run_sanitizer() {
    local tool="$1" t0=$SECONDS
    local cs
    cs="$(command -v compute-sanitizer || true)"
    [ -z "$cs" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && cs=/usr/local/cuda/bin/compute-sanitizer
    if [ -z "$cs" ]; then
        record sanitize "$tool" skipped "compute-sanitizer not found (PATH, /usr/local/cuda/bin)" 0
        return
    fi
    echo "---- compute-sanitizer --tool $tool"
    local extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report analysis)
    timeout 540 "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 1 --target-processes all \
        "$PY" tests/gpu/sanitize_run.py > "$OUT_DIR/sanitize_$tool.log" 2>&1
    local rc=$?
    tail -n 30 "$OUT_DIR/sanitize_$tool.log"
    local errors
    errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ error" "$OUT_DIR/sanitize_$tool.log" | tail -1)
    if [ $rc -eq 0 ]; then
        record sanitize "$tool" passed "" $((SECONDS - t0))
    elif [ $rc -eq 124 ]; then
        record sanitize "$tool" failed "timed out after 540 s" $((SECONDS - t0))
    else
        record sanitize "$tool" failed "exit $rc${errors:+, $errors}s (sanitize_$tool.log)" $((SECONDS - t0))
    fi
}

run_bench() {
    local t0=$SECONDS
    echo "---- benchmarks/kernels_cuda.py"
    timeout 540 "$PY" benchmarks/kernels_cuda.py --sizes 16M,64M,256M --json "$OUT_DIR/kernels.json"
    local rc=$?
    if [ $rc -eq 0 ]; then
        record bench kernels_cuda passed "" $((SECONDS - t0)) "$OUT_DIR/kernels.json"
    else
        record bench kernels_cuda failed "exit $rc (1: a result differs from the CPU; 2: no CUDA device; else a crash)" \
            $((SECONDS - t0)) "$OUT_DIR/kernels.json"
    fi
}

if ! env_info; then
    echo "no usable GPU: nothing else can run"
    exit 1
fi
for g in "${expanded[@]}"; do
    if [ "$g" = build ]; then
        do_build explicit
        continue
    fi
    if ! do_build implicit; then
        record "$g" all failed "skipped: the build failed" 0
        continue
    fi
    case "$g" in
        pytest) run_pytest ;;
        bytes|driver|train)
            echo "---- $g"
            "$PY" "$HARNESS" "$g" --out "$OUT_DIR" || FAILED=1 ;;
        memcheck|racecheck|synccheck) run_sanitizer "$g" ;;
        bench) run_bench ;;
    esac
done

"$PY" - "$OUT_DIR/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("==== summary (%s): %s" % (sys.argv[1], json.dumps(s.get("counts", {}))))
for name, r in sorted(s.get("checks", {}).items()):
    why = r.get("error") or r.get("reason") or ""
    print("  %-48s %-8s %6.1f s  %s" % (name, r["status"], r.get("seconds", 0), why[:100]))
PYEOF
echo "log: $LOG"
exit $FAILED
