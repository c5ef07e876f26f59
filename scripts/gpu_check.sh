#!/usr/bin/env bash
# The GPU check (`make test-gpu`; `make test-gpu-dry` rehearses it on the CPU): what the machine has, then
# the bounded GPU sweep, then its report, all inside one outer time limit.
#
#   bash scripts/gpu_check.sh OUT_DIR [gpu_sweep.py options, e.g. --kernels intree,fla --lengths 64,1024]
#   bash scripts/gpu_check.sh OUT_DIR --device cpu --dry-run      # the CPU rehearsal
#
# Runs from this checkout as it is: PYTHONPATH is set to the checkout and the device bundle
# (DEVICE_BUNDLE, default .device-bundle, built by `make device-bundle`: the third-party kernel packages
# a GPU machine without network lacks). Nothing is installed, nothing is downloaded.
#
# Time (GPU_CHECK_TOTAL_S, default 470 s: the whole run under 8 minutes), by phase:
#   environment  nvidia-smi and torch/CUDA, at most ENV_S (default 45 s)
#   sweep        scripts/gpu_sweep.py, stopped (SIGTERM, then SIGKILL 15 s later) at what is left minus
#                FINISH_S; its own budget (--budget-s) ends the cases FINISH_S + CASE_MARGIN_S (30 s) before
#                that, so it normally finishes by itself; on SIGTERM it stops where it is and finishes
#   finish       only when the sweep was killed: `gpu_sweep.py OUT_DIR --finish --cut-short WHY` in a fresh
#                process that does not touch the GPU (CUDA_VISIBLE_DEVICES=""), at most FINISH_S (45 s):
#                the report and the summary from the records already on disk
# The summary is printed last. Exit status: the sweep's (0, 1, 3: see gpu_sweep.py), or the finish's
# after a cut; 2 on a usage error. PYTHON picks the interpreter (default python3).
set -uo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash scripts/gpu_check.sh OUT_DIR [gpu_sweep.py options]" >&2
    exit 2
fi
OUT_DIR="$1"
shift
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="${DEVICE_BUNDLE:-.device-bundle}"
[[ "$BUNDLE" = /* ]] || BUNDLE="$ROOT/$BUNDLE"
TOTAL_S="${GPU_CHECK_TOTAL_S:-470}"
ENV_S="${ENV_S:-45}"
FINISH_S="${FINISH_S:-45}"
CASE_MARGIN_S="${CASE_MARGIN_S:-30}"  # the last case (30 s call timeout) and the report after the budget
SECONDS=0

# byte-code caches out of the checkout and the bundle (they would travel with the next carry). Not where no
# byte code is written (PYTHONDONTWRITEBYTECODE): there a prefix would only hide the installed packages' own
# caches, and every process of the run (the sweep, its workers) would compile torch from source (7 s, not 3 s)
if [[ -z "${PYTHONDONTWRITEBYTECODE:-}" ]]; then
    export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/harness-pycache}"
fi
if [[ -d "$BUNDLE" ]]; then
    export PYTHONPATH="$ROOT:$BUNDLE${PYTHONPATH:+:$PYTHONPATH}"
    echo "== PYTHONPATH: checkout $ROOT, device bundle $BUNDLE"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    echo "== PYTHONPATH: checkout $ROOT (no device bundle at $BUNDLE: third-party kernels only where installed)"
fi
echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi || echo "nvidia-smi failed with exit status $?"
else
    echo "nvidia-smi: not installed on this machine"
fi

echo "== torch / CUDA"
timeout -k 5 "$ENV_S" "$PYTHON" -c 'from harness.gpu import describe_environment; print("\n".join(describe_environment()))' \
    || echo "describing the environment failed or took over ${ENV_S} s (exit status $?)"

LEFT=$((TOTAL_S - SECONDS - FINISH_S))
BUDGET=$((LEFT - FINISH_S - CASE_MARGIN_S))
if (( BUDGET < 5 )); then
    echo "gpu_check: only ${LEFT} s left for the sweep after ${SECONDS} s; GPU_CHECK_TOTAL_S=${TOTAL_S} is too small" >&2
    exit 2
fi
echo "== GPU sweep -> $OUT_DIR (killed after ${LEFT} s; cases start within ${BUDGET} s; ${SECONDS} s spent so far)"
# --budget-s first: an explicit --budget-s among the arguments comes later and wins
# --preserve-status: on the limit the sweep gets SIGTERM, finishes by itself and its own status comes back;
# 137 (SIGKILL, 15 s later) or 143 (SIGTERM unhandled) mean it could not, and the finish pass runs
timeout --preserve-status -k 15 "$LEFT" "$PYTHON" "$ROOT/scripts/gpu_sweep.py" "$OUT_DIR" --budget-s "$BUDGET" "$@"
rc=$?
if [[ $rc -eq 137 || $rc -eq 143 ]]; then
    why="the outer time limit: the sweep was killed after ${LEFT} s (exit status $rc)"
    echo "== cut short by $why; finishing from the records on disk"
    CUDA_VISIBLE_DEVICES="" timeout -k 5 "$FINISH_S" "$PYTHON" "$ROOT/scripts/gpu_sweep.py" "$OUT_DIR" --finish \
        --cut-short "$why"
    rc=$?
fi
echo "== gpu_check: exit status $rc after ${SECONDS} s"
exit $rc
