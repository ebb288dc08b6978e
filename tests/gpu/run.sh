#!/usr/bin/env bash
# tests/gpu/run.sh: everything of fsdpcomp that needs a GPU, in one command, written to one log
# and one JSON summary. Run from anywhere on a machine with a GPU, nvcc and a CUDA build of torch
# (no network needed: nothing is installed from outside):
#
#   bash tests/gpu/run.sh                 # all groups, in the order below
#   bash tests/gpu/run.sh GROUP...        # some of them
#   bash tests/gpu/run.sh --emulated GROUP...   # no GPU: the emulated CUDA library (CI)
#
# Every group runs under an outer timeout of FSDPCOMP_GPU_GROUP_TIMEOUT seconds (default 600)
# and records each check's result the moment it ends, so a group cut off by the timeout keeps
# what it finished. Order and estimated time on one H100 (estimates: no GPU has run this script
# yet; the first run's summary.json has the real seconds). `all` runs the groups in this order,
# the most telling first, so that in a 40-minute GPU session the ones left out are the last
# sanitizers; over two sessions:
#   session 1 (12-24 min):  build pytest bytes driver
#   session 2 (12-30 min):  train memcheck initcheck bench
#   then, with time left:   racecheck synccheck (3-9 min each)
# (prereq always runs first, in seconds.)
#
#   prereq     ~10 s     python, torch with CUDA and a GPU, nvcc, the host compiler, pytest,
#                        compute-sanitizer: a missing one is said first (always runs)
#   build      ~3-5 min  build in place (FSDPCOMP_CUDA=1, this GPU's arch unless
#                        FSDPCOMP_CUDA_ARCHS is set; FSDPCOMP_WERROR=0 unless set: the
#                        machine's own gcc may warn where CI's does not), skipped when the build
#                        is newer than the sources; every other group builds first if needed
#   pytest     ~4-8 min  tests/cuda/test_cuda*.py (not the *_emulated.py runners) under pytest, every
#                        test's outcome recorded as it ends (pytest_results.jsonl)
#   bytes      ~4-8 min  payload bytes, residuals and decodes = the CPU's for every config of
#                        tests/helpers/method_cases.py of every method with CUDA kernels, at n = 1, 255,
#                        257, 2^20+3 and one case above 2^31 bytes; loopback decode of W payloads;
#                        single-payload compress/decompress (tests/gpu/checks_bytes.py)
#   driver     ~1-3 min  300 calls on one State without counters(), event-timed collectives,
#                        counters() without the GIL, the sampling rule, NCCL release / drop /
#                        exit / init timeout (tests/gpu/checks_driver.py)
#   train      ~4-8 min  one-GPU FSDP1, FSDP2 and DDP through an NCCL process group with
#                        compress_own_chunk, every CUDA method, transports torch and nccl; the
#                        real examples/fsdp_train.py (tests/gpu/checks_train.py)
#   memcheck, initcheck, racecheck, synccheck   ~3-9 min each: compute-sanitizer's tools on
#                        tests/gpu/sanitize_run.py (`sanitize`: all four)
#   bench      ~2-4 min  benchmarks/kernels_cuda.py: the kernel table
#
# --emulated (FSDPCOMP_GPU_EMULATED=1): no GPU. `build` builds tests/cuda_emu's host emulation
# of the CUDA library, which _C loads (FSDPCOMP_CUDA_LIB) for CPU tensors
# (FSDPCOMP_TEST_EMULATED=1); pytest collects the files only (CI runs them through the
# *_emulated.py wrappers), bytes runs at small sizes, the sanitizer groups run
# sanitize_run.py's calls without a sanitizer, and what needs the hardware (NCCL, timing, GPU
# memory, compute-sanitizer, the benchmark) is recorded as skipped. tests/cuda/test_gpu_script.py
# runs it so in CI: the script's own logic is tested before a GPU ever sees it.
#
# Output: $FSDPCOMP_GPU_OUT, else $OUT/gpu when $OUT is set, else build/gpu: run.log (everything
# printed, appended) and summary.json (per check: passed / failed / skipped with the reason and
# seconds and details; the kernel table; the training rows), merged across invocations. A
# failing check never stops the others; the exit status is non-zero if any check of this
# invocation failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
EMULATED="${FSDPCOMP_GPU_EMULATED:-0}"
if [ "${1:-}" = --emulated ]; then EMULATED=1; shift; fi
OUT_DIR="${FSDPCOMP_GPU_OUT:-}"
if [ -z "$OUT_DIR" ]; then
    if [ -n "${OUT:-}" ]; then OUT_DIR="$OUT/gpu"; else OUT_DIR="$ROOT/build/gpu"; fi
fi
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
exec > >(tee -a "$LOG") 2>&1
PY="${PYTHON:-python3}"
# the checkout's fsdpcomp (built in place by the build group); emulated without an in-place build
# (CI: fsdpcomp installed), the installed one: the bare source tree has no _C and would shadow it
NO_CWD=()
if [ "$EMULATED" = 1 ] && ! ls "$ROOT"/fsdpcomp/_C*.so >/dev/null 2>&1; then
    NO_CWD=(-P)
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
HARNESS="$ROOT/tests/gpu/harness.py"
GROUP_TIMEOUT="${FSDPCOMP_GPU_GROUP_TIMEOUT:-600}"
export FSDPCOMP_WERROR="${FSDPCOMP_WERROR:-0}"
FAILED=0

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(all)
expanded=()
for g in "${groups[@]}"; do
    case "$g" in
        all) expanded+=(build pytest bytes driver train memcheck initcheck bench racecheck synccheck) ;;
        sanitize) expanded+=(memcheck initcheck racecheck synccheck) ;;
        build|pytest|bytes|driver|memcheck|initcheck|racecheck|synccheck|train|bench) expanded+=("$g") ;;
        prereq) ;;  # always runs first
        *) echo "unknown group '$g' (all, prereq, build, pytest, bytes, driver, train, sanitize, memcheck, initcheck, racecheck, synccheck, bench)"; exit 2 ;;
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

# bounded CMD...: runs CMD under the group's outer timeout (124: it ran past it)
bounded() {
    timeout -k 15 "$GROUP_TIMEOUT" "$@"
}

echo "==== tests/gpu/run.sh $(date -u +%FT%TZ): groups ${expanded[*]}; output $OUT_DIR; emulated $EMULATED"

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
    home_nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or (home_nvcc if os.path.exists(home_nvcc) else None)
    info["nvcc"] = nvcc and version([nvcc, "--version"])
    if not nvcc:
        missing.append("nvcc (NVCC, CUDA_HOME/bin or PATH)")
    cs = shutil.which("compute-sanitizer") or ("/usr/local/cuda/bin/compute-sanitizer"
                                               if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    info["compute_sanitizer"] = cs
    if not cs:
        notes.append("no compute-sanitizer: the sanitizer groups will skip")
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
        [ $rc -eq 124 ] && why="the build ran past ${GROUP_TIMEOUT} s"
        record build build failed "$why" $((SECONDS - t0))
        return 1
    fi
}

# the pytest files of the group: every tests/cuda/test_cuda*.py but the emulator's own tests
pytest_files() {
    local f
    for f in tests/cuda/test_cuda*.py; do
        case "$f" in *_emulated.py|*/test_cuda_emu_*) ;; *) echo "$f" ;; esac
    done
}

run_pytest() {
    local t0=$SECONDS
    if ! "$PY" -c "import pytest" 2>/dev/null; then
        record pytest cuda_tests skipped "pytest is not installed here" 0
        return
    fi
    local files
    mapfile -t files < <(pytest_files)
    local rec="$OUT_DIR/pytest_results.jsonl" extra=()
    rm -f "$rec"
    # emulated: collected only (CI runs these files on the emulation through the wrappers)
    [ "$EMULATED" = 1 ] && extra=(--collect-only -qq)
    echo "---- pytest ${files[*]} ${extra[*]}"
    FSDPCOMP_PYTEST_RECORD="$rec" PYTHONPATH="$ROOT/tests/gpu${PYTHONPATH:+:$PYTHONPATH}" bounded "$PY" "${NO_CWD[@]}" -m pytest "${files[@]}" \
        -q -rs -p no:cacheprovider -p pytest_record --junitxml="$OUT_DIR/pytest.xml" "${extra[@]}"
    local rc=$?
    "$PY" "$ROOT/tests/gpu/pytest_record.py" "$rec" "$OUT_DIR/pytest_summary.json"
    if [ $rc -eq 0 ]; then
        record pytest cuda_tests passed "" $((SECONDS - t0)) "$OUT_DIR/pytest_summary.json"
    elif [ $rc -eq 124 ]; then
        record pytest cuda_tests failed "ran past ${GROUP_TIMEOUT} s (pytest_summary.json: last)" $((SECONDS - t0)) \
            "$OUT_DIR/pytest_summary.json"
    else
        record pytest cuda_tests failed "pytest exit $rc (see run.log, pytest_summary.json)" $((SECONDS - t0)) \
            "$OUT_DIR/pytest_summary.json"
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
        record sanitize "$tool" failed "timed out after ${GROUP_TIMEOUT} s" $((SECONDS - t0))
    else
        record sanitize "$tool" failed "exit $rc${errors:+, $errors}s (sanitize_$tool.log)" $((SECONDS - t0))
    fi
}

run_bench() {
    local t0=$SECONDS
    if [ "$EMULATED" = 1 ]; then
        record bench kernels_cuda skipped "emulated run: timing needs a GPU" 0
        return
    fi
    echo "---- benchmarks/kernels_cuda.py"
    bounded "$PY" benchmarks/kernels_cuda.py --sizes 16M,64M,256M --json "$OUT_DIR/kernels.json"
    local rc=$?
    if [ $rc -eq 0 ]; then
        record bench kernels_cuda passed "" $((SECONDS - t0)) "$OUT_DIR/kernels.json"
    else
        record bench kernels_cuda failed "exit $rc (1: a result differs from the CPU; 2: no CUDA device; 124: past ${GROUP_TIMEOUT} s; else a crash)" \
            $((SECONDS - t0)) "$OUT_DIR/kernels.json"
    fi
}

if ! prereq; then
    echo "prerequisites missing (above): nothing else runs"
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
            skip=()
            [ "$EMULATED" = 1 ] && [ "$g" != bytes ] && skip=(--skip "emulated run: $g needs a GPU (NCCL, streams, timing)")
            # the harness's budget ends before the outer timeout, so it records what it did not run
            bounded "$PY" "$HARNESS" "$g" --out "$OUT_DIR" --budget $((GROUP_TIMEOUT - 30)) "${skip[@]}" || FAILED=1 ;;
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
