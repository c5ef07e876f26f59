"""On a CPU-only machine, Triton kernels run interpreted only if TRITON_INTERPRET=1 precedes `import triton`.

Checked in fresh processes: importing triton first makes the Triton adapters unavailable with that
reason (instead of failing each call with "Cannot call @triton.jit'd outside of the scope of a
kernel"); the harness CLI sets the variable itself at start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the Triton kernels run compiled"),
              pytest.mark.e2e]  # end to end (fresh interpreters): `make test-all`
pytest.importorskip("triton")
pytest.importorskip("accelerated_scan")

PROBE = ("from harness.kernels.registry import get; "
         "print(get('accelerated_scan.scalar').unavailable_reason())")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_triton_imported_first_makes_the_adapter_unavailable_with_the_reason():
    proc = _run("import triton; " + PROBE)
    assert "triton was imported before TRITON_INTERPRET=1" in proc.stdout, proc.stdout + proc.stderr


def test_interpret_if_no_gpu_at_start_up_makes_it_run():
    code = ("from harness.kernels.triton_interpreter import interpret_if_no_gpu; interpret_if_no_gpu(); "
            "import triton; " + PROBE)
    proc = _run(code)
    assert proc.stdout.strip() == "None", proc.stdout + proc.stderr
