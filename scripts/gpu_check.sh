#!/usr/bin/env bash
# The GPU check (`make test-gpu`): what the machine has, then the bounded GPU sweep.
#
#   bash scripts/gpu_check.sh OUT_DIR [gpu_sweep.py options, e.g. --budget-s 300 --kernels intree,fla]
#
# Prints nvidia-smi (when installed), the torch / CUDA / cuDNN versions and the device, then runs
# scripts/gpu_sweep.py OUT_DIR, which writes its records and report into OUT_DIR and prints the summary
# table last. Without a usable GPU the sweep prints one line saying why and the script exits 0.
# PYTHON picks the interpreter (default python3).
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash scripts/gpu_check.sh OUT_DIR [gpu_sweep.py options]" >&2
    exit 2
fi
OUT_DIR="$1"
shift
PYTHON="${PYTHON:-python3}"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || echo "nvidia-smi failed with exit status $?"
else
    echo "nvidia-smi: not installed on this machine"
fi

echo "== torch / CUDA"
"$PYTHON" -c 'from harness.gpu import describe_environment; print("\n".join(describe_environment()))'

echo "== GPU sweep -> $OUT_DIR"
exec "$PYTHON" "$SCRIPT_DIR/gpu_sweep.py" "$OUT_DIR" "$@"
