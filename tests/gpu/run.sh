#!/usr/bin/env bash
# tests/gpu/run.sh: everything of fsdpcomp that needs a GPU, written to one log and one JSON
# summary, sized to a GPU window of about 15 minutes (its start included). Build where nvcc is,
# run where the GPU is (tests/gpu/README.md has the exact device command):
#
#   bash tests/gpu/run.sh prepare [--archs 90]   # here, no GPU: builds .gpu/ (prepare.py)
#   bash tests/gpu/run.sh quick                  # there, first:  ~7 min, the most telling
#   bash tests/gpu/run.sh rest                   # there, second: <= 8 min, the sanitizers and the rest
#   bash tests/gpu/run.sh GROUP...               # single groups, full size (reruns)
#   bash tests/gpu/run.sh quick:bench quick:train # single items of a profile, at its size
#   bash tests/gpu/run.sh --emulated quick rest  # no GPU: the emulated CUDA library (CI)
#
# When .gpu/manifest.json is there (FSDPCOMP_GPU_PREPARED names another folder) the run uses the
# carried libraries and compiles nothing: prepare.py verify refuses, before any check, a CUDA
# library of another FC_CUDA_ABI, one without code for this GPU's arch, or one built from other
# sources than the checkout's. Without it the `build` group builds in place (3-5 min of nvcc).
#
# The profiles, in order; seconds measured on one H200 on 2026-11-27/28 (the first GPU runs; an
# H100 should take about as long: most of it is the CPU reference and Python) unless marked
# "estimate" (not yet run on a GPU), [cap] each item's outer timeout. Each check's result is
# written the moment it ends, so a cut run keeps them.
#   quick (~7 min; the caps sum to 8.6 min, so a slow check is cut, not the command):
#     prereq + carried    ~20 s     python, torch with a GPU, compute-sanitizer, ncu; the carried libs
#     bench  ~25 s est.  [50]  FIRST, so the speed is known within 2 minutes of the command's start:
#                              the kernel table (benchmarks/kernels_cuda.py --profile quick): every
#                              method at 2^26 (gradiveq 2^24) and at 2^16 (the fixed cost), int8
#                              +ef and +sampled, each checked against the CPU first, against a
#                              device-to-device copy of the same run
#     pytest     ~165 s [180]  tests/cuda/test_cuda{,_single,_sparse,_param_gather,_geometry,_res8,_dct}.py:
#                              device payloads and residuals = the CPU's, bit for bit
#     bytes       ~67 s  [85]  payload bytes at n = 1, 255, 257, 2^20+3, every method and config
#     driver      ~30 s  [60]  300 calls, event-timed collectives, counters without the GIL, the
#                              sampling rule
#     train  ~86 s est. [115]  one-GPU FSDP1, FSDP2 (int8 + param_gather int8 among them) and DDP
#                              on an NCCL process group, every method (~30 s measured); gpt2-62m's
#                              codec ms per step under FSDP2 int8 + param_gather int8 (~12 s,
#                              estimate); the real examples/fsdp_train.py (~44 s measured)
#     memcheck    ~11 s  [25]  compute-sanitizer memcheck over tests/gpu/sanitize_run.py
#   rest (caps 8 min; not yet run on a GPU: estimates):
#     pytest      ~25 s  [40]  tests/cuda/test_cuda_build.py (the library as CI sees it)
#     initcheck, racecheck, synccheck  ~15-60 s each [60, 90, 60]
#     bytes     ~60-120 s [120] the 2^29+17 element (> 2^31 bytes) encode and decode
#     bench      ~60 s [100]  the rest of the kernel table: the config variants, +ef and +sampled
#                              of every method, every method at 2^24 and 2^28
#   (tests/cuda/test_cuda_driver.py runs the driver group's checks again under pytest: in no
#   profile; `bash tests/gpu/run.sh pytest` runs every file.)
#
# Single groups, full size, default timeout FSDPCOMP_GPU_GROUP_TIMEOUT (600 s):
#   build, pytest, bytes, driver, train, bench, memcheck, initcheck, racecheck, synccheck,
#   sanitize (the four), all (every group). FSDPCOMP_GPU_TIMEOUT_<GROUP> sets one group's timeout,
#   FSDPCOMP_GPU_ONLY / FSDPCOMP_GPU_EXCLUDE (comma-separated check names) pick checks,
#   FSDPCOMP_GPU_PYTEST_ARGS adds pytest arguments.
#
# --emulated (FSDPCOMP_GPU_EMULATED=1): no GPU. `build` builds tests/cuda_emu's host emulation
# of the CUDA library, which _C loads (FSDPCOMP_CUDA_LIB) for CPU tensors
# (FSDPCOMP_TEST_EMULATED=1); pytest collects the files only (CI runs them through the
# *_emulated.py wrappers), bytes runs at small sizes, the sanitizer groups run
# sanitize_run.py's calls without a sanitizer, and what needs the hardware (NCCL, timing, GPU
# memory, compute-sanitizer, the benchmark) is recorded as skipped. tests/cuda/test_gpu_script.py
# runs `prepare`, restores its folder into a clean copy of the tree and runs `--emulated quick
# rest` there in CI: the script's logic and the carried layout are tested before a GPU sees them.
#
# Output: $FSDPCOMP_GPU_OUT, else $OUT/gpu when $OUT is set, else build/gpu: run.log (everything
# printed, appended), summary.json (per check: passed / failed / skipped with the reason and
# seconds and details; merged across invocations), env.json, carried.json, pytest_*.json*,
# kernels_<profile>.json, sanitize_<tool>.log. A failing check never stops the others; the
# exit status is non-zero if any check of this invocation failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
# prepare: the build machine's step, before any GPU run (no log, no summary: prepare.py says it)
if [ "${1:-}" = prepare ]; then
    shift
    exec "$PY" "$ROOT/tests/gpu/prepare.py" build "$@"
fi
EMULATED="${FSDPCOMP_GPU_EMULATED:-0}"
if [ "${1:-}" = --emulated ]; then EMULATED=1; shift; fi
OUT_DIR="${FSDPCOMP_GPU_OUT:-}"
if [ -z "$OUT_DIR" ]; then
    if [ -n "${OUT:-}" ]; then OUT_DIR="$OUT/gpu"; else OUT_DIR="$ROOT/build/gpu"; fi
fi
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
exec > >(tee -a "$LOG") 2>&1
PREPARED="${FSDPCOMP_GPU_PREPARED:-$ROOT/.gpu}"
CARRIED=0
[ -f "$PREPARED/manifest.json" ] && CARRIED=1
export FSDPCOMP_GPU_CARRIED=$CARRIED
HARNESS="$ROOT/tests/gpu/harness.py"
GROUP_TIMEOUT="${FSDPCOMP_GPU_GROUP_TIMEOUT:-600}"
export FSDPCOMP_WERROR="${FSDPCOMP_WERROR:-0}"
FAILED=0

# The work list: items PROFILE:GROUP (PROFILE empty for a single group at full size). A profile
# sizes each of its items (timeout, files, checks, benchmark rows) in item_settings below.
# quick's bench first: the kernels' speed is what a GPU window is most often for (tests/gpu/README.md)
QUICK_ITEMS=(quick:bench quick:pytest quick:bytes quick:driver quick:train quick:memcheck)
REST_ITEMS=(rest:pytest rest:initcheck rest:racecheck rest:synccheck rest:bytes rest:bench)
items=()
[ $# -eq 0 ] && set -- quick
for g in "$@"; do
    case "$g" in
        quick) items+=("${QUICK_ITEMS[@]}") ;;
        rest) items+=("${REST_ITEMS[@]}") ;;
        all) items+=(:build :pytest :bytes :driver :train :memcheck :initcheck :bench :racecheck :synccheck) ;;
        sanitize) items+=(:memcheck :initcheck :racecheck :synccheck) ;;
        build|pytest|bytes|driver|memcheck|initcheck|racecheck|synccheck|train|bench) items+=(":$g") ;;
        prereq) ;;  # always runs first
        quick:*|rest:*)  # one item of a profile, at its size (a short window: `quick:bench quick:pytest`)
            case " ${QUICK_ITEMS[*]} ${REST_ITEMS[*]} " in
                *" $g "*) items+=("$g") ;;
                *) echo "unknown item '$g' (${QUICK_ITEMS[*]} ${REST_ITEMS[*]})"; exit 2 ;;
            esac ;;
        *) echo "unknown group '$g' (prepare, quick, rest, all, prereq, build, pytest, bytes, driver, train, bench, sanitize, memcheck, initcheck, racecheck, synccheck)"; exit 2 ;;
    esac
done

# item_settings PROFILE GROUP: CUR_TIMEOUT, PYTEST_SET (quick | rest | all), CHECK_ONLY and
# CHECK_EXCLUDE (the harness's check names), BENCH_PROFILE, and the suffix of what it records.
item_settings() {
    local profile="$1" group="$2" v="FSDPCOMP_GPU_TIMEOUT_${2^^}"
    CUR_TIMEOUT="${!v:-$GROUP_TIMEOUT}"
    PYTEST_SET=all
    CHECK_ONLY="${FSDPCOMP_GPU_ONLY:-}"
    CHECK_EXCLUDE="${FSDPCOMP_GPU_EXCLUDE:-}"
    BENCH_PROFILE=all
    SUFFIX="${profile:+_$profile}"
    case "$profile:$group" in
        quick:pytest) CUR_TIMEOUT=180; PYTEST_SET=quick ;;
        quick:bytes) CUR_TIMEOUT=85; CHECK_EXCLUDE=encode_above_2_31_bytes ;;
        quick:driver) CUR_TIMEOUT=60 ;;
        quick:train) CUR_TIMEOUT=115 ;;
        quick:bench) CUR_TIMEOUT=50; BENCH_PROFILE=quick ;;
        quick:memcheck) CUR_TIMEOUT=25 ;;
        rest:pytest) CUR_TIMEOUT=40; PYTEST_SET=rest ;;
        rest:initcheck|rest:synccheck) CUR_TIMEOUT=60 ;;
        rest:racecheck) CUR_TIMEOUT=90 ;;
        rest:bytes) CUR_TIMEOUT=120; CHECK_ONLY=encode_above_2_31_bytes ;;
        rest:bench) CUR_TIMEOUT=100; BENCH_PROFILE=rest ;;
    esac
}
CUR_TIMEOUT="$GROUP_TIMEOUT"

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

# bounded CMD...: runs CMD under the current item's outer timeout (124: it ran past it)
bounded() {
    timeout -k 15 "$CUR_TIMEOUT" "$@"
}

echo "==== tests/gpu/run.sh $(date -u +%FT%TZ): ${items[*]}; output $OUT_DIR; emulated $EMULATED; carried $CARRIED"


# What the build and the checks need, each said by name before anything runs: python 3.10+,
# torch (with CUDA and a visible GPU, unless emulated), nvcc and the host compiler, pytest,
# compute-sanitizer, transformers (the examples' GPT-2; its check skips without it).
prereq() {
    local t0=$SECONDS
    "$PY" - "$OUT_DIR/env.json" "$EMULATED" <<'PYEOF'
import json, os, shutil, subprocess, sys
out, emulated = sys.argv[1], sys.argv[2] == "1"
info, missing, notes = {"python": sys.version.split()[0], "emulated": emulated, "cpus": os.cpu_count()}, [], []
if sys.version_info < (3, 10):
    missing.append(f"python >= 3.10 (this is {info['python']})")
def version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip().splitlines()[-1] if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), capability="%d%d" % torch.cuda.get_device_capability(0),
                    memory_gib=round(p.total_memory / 2**30, 1), device_count=torch.cuda.device_count())
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:
            info["nccl"] = f"unknown ({e})"
    elif not emulated:
        missing.append("a GPU torch can see (torch.cuda.is_available() is False)" if torch.version.cuda
                       else f"a CUDA build of torch (this one, {torch.__version__}, has none)")
except Exception as e:
    missing.append(f"torch (import failed: {e})")
cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
info["cxx"] = cxx and f"{cxx} {version([cxx, '-dumpfullversion'])}"
if not cxx:
    missing.append("a C/C++ compiler (g++)")
if not emulated:
    carried = os.environ.get("FSDPCOMP_GPU_CARRIED") == "1"
    home_nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or (home_nvcc if os.path.exists(home_nvcc) else None)
    info["nvcc"] = nvcc and version([nvcc, "--version"])
    if not nvcc and not carried:  # carried libraries: nothing is compiled here
        missing.append("nvcc (NVCC, CUDA_HOME/bin or PATH), or a prepared folder (run.sh prepare)")
    cs = shutil.which("compute-sanitizer") or ("/usr/local/cuda/bin/compute-sanitizer"
                                               if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    info["compute_sanitizer"] = cs
    if not cs:
        notes.append("no compute-sanitizer: the sanitizer groups will skip")
    # Nsight Compute: whether this machine could measure the kernels' DRAM bytes (the kernel
    # table's `moved` column is a model until a run does)
    info["ncu"] = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
                                               if os.path.exists(p)), None)
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=30).stdout.strip()
    except Exception:
        pass
for mod, why in (("pytest", "the pytest group skips"), ("setuptools", "the build fails"),
                 ("transformers", "the fsdp_train.py check skips")):
    try:
        __import__(mod)
    except ImportError:
        (missing if mod == "setuptools" else notes).append(f"no {mod}: {why}")
info["missing"], info["notes"] = missing, notes
json.dump(info, open(out, "w"), indent=1)
print(json.dumps(info))
for m in missing:
    print(f"MISSING: {m}")
for n in notes:
    print(f"note: {n}")
sys.exit(3 if missing else 0)
PYEOF
    local rc=$?
    if [ $rc -eq 0 ]; then
        record env prereq passed "" $((SECONDS - t0)) "$OUT_DIR/env.json"
    else
        record env prereq failed "missing prerequisites (env.json: missing)" $((SECONDS - t0)) "$OUT_DIR/env.json"
    fi
    return $rc
}

# The carried folder (prepare.py verify): refused libraries stop the run before any check; else
# they are in fsdpcomp/ and the carried wheels on PYTHONPATH.
carried() {
    local t0=$SECONDS extra=()
    [ "$EMULATED" = 1 ] && extra=(--emulated)
    echo "---- carried libraries ($PREPARED)"
    "$PY" "$ROOT/tests/gpu/prepare.py" verify --dir "$PREPARED" --json "$OUT_DIR/carried.json" "${extra[@]}"
    local rc=$?
    if [ $rc -ne 0 ]; then
        record env carried failed "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("refused", "verify crashed"))' "$OUT_DIR/carried.json" 2>/dev/null || echo "verify crashed (run.log)")" \
            $((SECONDS - t0)) "$OUT_DIR/carried.json"
        return 1
    fi
    [ -d "$PREPARED/site" ] && export PYTHONPATH="$PREPARED/site${PYTHONPATH:+:$PYTHONPATH}"
    record env carried passed "" $((SECONDS - t0)) "$OUT_DIR/carried.json"
}

build_needed() {
    local lib="$ROOT/fsdpcomp/_fsdpcomp_cuda.so" c
    c=$(ls "$ROOT"/fsdpcomp/_C*.so 2>/dev/null | head -1)
    [ -f "$lib" ] && [ -n "$c" ] || return 0
    [ -n "$(find "$ROOT/csrc" "$ROOT/cuda" "$ROOT/setup.py" -newer "$lib" -print -quit)" ] && return 0
    [ -n "$(find "$ROOT/csrc" "$ROOT/cuda" "$ROOT/setup.py" -newer "$c" -print -quit)" ] && return 0
    return 1
}

# emulated: the host emulation of the CUDA library, which _C loads in place of the real one
build_emulated() {
    local t0=$SECONDS lib
    echo "---- build (emulated: tests/cuda_emu)"
    if lib=$(cd "$ROOT/tests/cuda_emu" && bounded "$PY" -c 'import build, sys; print(build.build_shared(sys.argv[1]))' \
             "${FSDPCOMP_EMU_DIR:-$OUT_DIR/emu}" | tail -1) && [ -f "$lib" ]; then
        export FSDPCOMP_CUDA_LIB="$lib" FSDPCOMP_TEST_EMULATED=1
        BUILD_OK=1
        record build build passed "" $((SECONDS - t0))
    else
        BUILD_FAILED=1
        record build build failed "the emulated library did not build (see run.log)" $((SECONDS - t0))
        return 1
    fi
}

BUILD_OK=""
BUILD_FAILED=""
do_build() {
    [ -n "$BUILD_OK" ] && return 0
    [ -n "$BUILD_FAILED" ] && return 1  # tried once in this invocation: not again per group
    [ "$EMULATED" = 1 ] && { build_emulated; return; }
    local t0=$SECONDS
    if [ "$CARRIED" = 1 ]; then  # verified before any item ran
        BUILD_OK=1
        [ "$1" = explicit ] && record build build skipped "the carried libraries ($PREPARED) are used" 0
        return 0
    fi
    if ! build_needed; then
        BUILD_OK=1
        [ "$1" = explicit ] && record build build skipped "the in-place build is newer than every source" 0
        return 0
    fi
    local archs="${FSDPCOMP_CUDA_ARCHS:-$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null)}"
    echo "---- build (archs ${archs:-setup.py default}, FSDPCOMP_WERROR=$FSDPCOMP_WERROR)"
    local env_archs=()
    [ -n "$archs" ] && env_archs=(FSDPCOMP_CUDA_ARCHS="$archs")
    bounded env FSDPCOMP_CUDA=1 "${env_archs[@]}" "$PY" setup.py build_ext --inplace
    local rc=$?
    if [ $rc -eq 0 ]; then
        BUILD_OK=1
        record build build passed "" $((SECONDS - t0))
    else
        BUILD_FAILED=1
        local why="setup.py build_ext --inplace failed (see run.log)"
        [ $rc -eq 124 ] && why="the build ran past ${CUR_TIMEOUT} s"
        record build build failed "$why" $((SECONDS - t0))
        return 1
    fi
}

# the pytest files of a set: every tests/cuda/test_cuda*.py but the emulator's own tests (all);
# quick: the device-equals-CPU files; rest: the library as CI sees it. test_cuda_driver.py
# repeats the driver group's checks under pytest: in `all` only.
pytest_files() {
    local f
    case "$1" in
        quick) printf '%s\n' tests/cuda/test_cuda.py tests/cuda/test_cuda_single.py tests/cuda/test_cuda_sparse.py \
                   tests/cuda/test_cuda_param_gather.py tests/cuda/test_cuda_geometry.py tests/cuda/test_cuda_res8.py \
                   tests/cuda/test_cuda_dct.py tests/cuda/test_cuda_onepass.py ;;
        rest) echo tests/cuda/test_cuda_build.py ;;
        *) for f in tests/cuda/test_cuda*.py; do
               case "$f" in *_emulated.py|*/test_cuda_emu_*) ;; *) echo "$f" ;; esac
           done ;;
    esac
}

run_pytest() {
    local t0=$SECONDS name="cuda_tests$SUFFIX"
    if ! "$PY" -c "import pytest" 2>/dev/null; then
        record pytest "$name" skipped "pytest is not installed here" 0
        return
    fi
    local files
    mapfile -t files < <(pytest_files "$PYTEST_SET")
    local rec="$OUT_DIR/pytest_results$SUFFIX.jsonl" extra=()
    rm -f "$rec"
    # emulated: collected only (CI runs these files on the emulation through the wrappers)
    [ "$EMULATED" = 1 ] && extra=(--collect-only -qq)
    # FSDPCOMP_GPU_PYTEST_ARGS: more pytest arguments (not -n: pytest-xdist's workers share one
    # GPU by time-slicing, and ran each test ~10x slower on the first H200 run)
    [ "$EMULATED" != 1 ] && [ -n "${FSDPCOMP_GPU_PYTEST_ARGS:-}" ] && read -ra extra <<< "$FSDPCOMP_GPU_PYTEST_ARGS"
    echo "---- pytest ${files[*]} ${extra[*]}"
    FSDPCOMP_PYTEST_RECORD="$rec" PYTHONPATH="$ROOT/tests/gpu${PYTHONPATH:+:$PYTHONPATH}" bounded "$PY" "${NO_CWD[@]}" -m pytest "${files[@]}" \
        -q -rs -p no:cacheprovider -p pytest_record "${extra[@]}"
    local rc=$?
    "$PY" "$ROOT/tests/gpu/pytest_record.py" "$rec" "$OUT_DIR/pytest_summary$SUFFIX.json"
    if [ $rc -eq 0 ]; then
        record pytest "$name" passed "" $((SECONDS - t0)) "$OUT_DIR/pytest_summary$SUFFIX.json"
    elif [ $rc -eq 124 ]; then
        record pytest "$name" failed "ran past ${CUR_TIMEOUT} s (pytest_summary$SUFFIX.json: last)" $((SECONDS - t0)) \
            "$OUT_DIR/pytest_summary$SUFFIX.json"
    else
        record pytest "$name" failed "pytest exit $rc (see run.log, pytest_summary$SUFFIX.json)" $((SECONDS - t0)) \
            "$OUT_DIR/pytest_summary$SUFFIX.json"
    fi
}

run_sanitizer() {
    local tool="$1" t0=$SECONDS
    if [ "$EMULATED" = 1 ]; then
        # the calls without a sanitizer, once: the script's logic (every entry point returns)
        if [ -z "${SANITIZE_RUN_DONE:-}" ]; then
            SANITIZE_RUN_DONE=1
            echo "---- tests/gpu/sanitize_run.py (emulated, no sanitizer)"
            if bounded "$PY" tests/gpu/sanitize_run.py; then
                record sanitize entry_points_emulated passed "" $((SECONDS - t0))
            else
                record sanitize entry_points_emulated failed "sanitize_run.py failed (see run.log)" $((SECONDS - t0))
            fi
        fi
        record sanitize "$tool" skipped "emulated run: compute-sanitizer needs a GPU" 0
        return
    fi
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
    # initcheck (no options of its own): reads of device memory nothing wrote, such as the
    # torch.empty buffers and scratch the kernels must fill before they read them
    bounded "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 1 --target-processes all \
        "$PY" tests/gpu/sanitize_run.py > "$OUT_DIR/sanitize_$tool.log" 2>&1
    local rc=$?
    tail -n 30 "$OUT_DIR/sanitize_$tool.log"
    local errors
    errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ error" "$OUT_DIR/sanitize_$tool.log" | tail -1)
    if [ $rc -eq 0 ]; then
        record sanitize "$tool" passed "" $((SECONDS - t0))
    elif [ $rc -eq 124 ]; then
        record sanitize "$tool" failed "timed out after ${CUR_TIMEOUT} s" $((SECONDS - t0))
    else
        record sanitize "$tool" failed "exit $rc${errors:+, $errors}s (sanitize_$tool.log)" $((SECONDS - t0))
    fi
}

run_bench() {
    local t0=$SECONDS name="kernels_cuda$SUFFIX"
    if [ "$EMULATED" = 1 ]; then
        # the rows the profile times, listed (no GPU needed): a profile that lost its rows fails
        if bounded "$PY" "${NO_CWD[@]}" benchmarks/kernels_cuda.py --list --profile "$BENCH_PROFILE" > "$OUT_DIR/bench_rows$SUFFIX.txt"; then
            record bench "$name" skipped "emulated run: timing needs a GPU ($(($(wc -l < "$OUT_DIR/bench_rows$SUFFIX.txt") - 1)) rows listed)" 0
        else
            record bench "$name" failed "kernels_cuda.py --list --profile $BENCH_PROFILE failed (run.log)" $((SECONDS - t0))
        fi
        return
    fi
    echo "---- benchmarks/kernels_cuda.py --profile $BENCH_PROFILE"
    bounded "$PY" benchmarks/kernels_cuda.py --profile "$BENCH_PROFILE" --json "$OUT_DIR/kernels$SUFFIX.json"
    local rc=$?
    if [ $rc -eq 0 ]; then
        record bench "$name" passed "" $((SECONDS - t0)) "$OUT_DIR/kernels$SUFFIX.json"
    else
        record bench "$name" failed "exit $rc (1: a result differs from the CPU; 2: no CUDA device; 124: past ${CUR_TIMEOUT} s; else a crash)" \
            $((SECONDS - t0)) "$OUT_DIR/kernels$SUFFIX.json"
    fi
}

if ! prereq; then
    echo "prerequisites missing (above): nothing else runs"
    exit 1
fi
if [ "$CARRIED" = 1 ] && ! carried; then
    echo "the carried libraries are refused (above): nothing else runs"
    exit 1
fi
# the checkout's fsdpcomp (carried or built in place); emulated without an in-place build (CI:
# fsdpcomp installed), the installed one: the bare source tree has no _C and would shadow it
NO_CWD=()
if [ "$EMULATED" = 1 ] && ! ls "$ROOT"/fsdpcomp/_C*.so >/dev/null 2>&1; then
    NO_CWD=(-P)
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
for item in "${items[@]}"; do
    profile="${item%%:*}" g="${item#*:}"
    item_settings "$profile" "$g"
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
            echo "---- $g${profile:+ ($profile)}"
            args=(--out "$OUT_DIR" --budget $((CUR_TIMEOUT - 10)))
            [ -n "$CHECK_ONLY" ] && args+=(--only ${CHECK_ONLY//,/ })
            [ "$EMULATED" = 1 ] && [ "$g" != bytes ] && args+=(--skip "emulated run: $g needs a GPU (NCCL, streams, timing)")
            # the harness's budget ends before the outer timeout, so it records what it did not run
            FSDPCOMP_GPU_EXCLUDE="$CHECK_EXCLUDE" bounded "$PY" "$HARNESS" "$g" "${args[@]}" || FAILED=1 ;;
        memcheck|initcheck|racecheck|synccheck) run_sanitizer "$g" ;;
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
