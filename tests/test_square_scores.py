"""Kernels whose memory is square in the length or the chunk (`Capabilities.square_scores`).

A parallel retention form holds (L x L) scores per batch row and head: 8.6 GB each in float64 at the
nightly profile's L = 32,768, so `harness check intree.retention_parallel --profile nightly` (and the
nightly calibration without a hand-set --max-length) had a correct kernel killed for memory, reported
as a kernel_error. The strategies and the calibration now draw such a kernel's n (its chunk, or else
its length) within `square_scores_limit`; kernels linear in memory keep the profile's full lengths, and
the ci profile's draws are unchanged.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from harness.kernels import registry
from harness.kernels.contract import SQUARE_SCORES_BYTES, square_scores_limit
from harness.problems import Problem
from harness.settings import LIMITS
from harness.strategies import problems
from tests.test_calibrate import calibrate  # noqa: F401 - the script, loaded once (a fixture)

NIGHTLY = LIMITS["nightly"]
NIGHTLY_SQUARE = square_scores_limit(NIGHTLY.max_batch * NIGHTLY.max_heads)

#: The kernels that form (n x n) matrices per batch row and head, by reading their code.
SQUARE = ("intree.retention_parallel", "intree.retention_chunkwise", "intree.retention_normed_parallel",
          "intree.retention_normed_chunkwise", "intree.gla_chunk_cumprod", "intree.simple_gla_chunk_cumprod",
          "torchscale.parallel", "torchscale.chunkwise", "yar.parallel", "yar.chunkwise")


def test_the_limit_is_the_largest_square_within_the_budget():
    for rows in (1, 6, 12, 7):
        for matrices in (1, 4, 10):
            n = square_scores_limit(rows, matrices)
            assert 8 * rows * matrices * n * n <= SQUARE_SCORES_BYTES < 8 * rows * matrices * (n + 1) ** 2
    assert NIGHTLY_SQUARE == 3344 < NIGHTLY.max_length
    ci = LIMITS["ci"]  # never binds in the ci profile: its draws are those of before
    assert square_scores_limit(ci.max_batch * ci.max_heads) >= ci.max_length + 2


@pytest.mark.parametrize("name", SQUARE)
def test_square_forms_declare_it(name):
    assert registry.get(name).capabilities.square_scores


@pytest.mark.parametrize("name", ["intree.retention_recurrent", "intree.sequential_retention", "intree.gla_chunk",
                                  "torchscale.recurrent", "yar.recurrent"])
def test_forms_linear_in_memory_do_not(name):
    assert not registry.get(name).capabilities.square_scores


def _nightly_draws(name: str, n: int = 150) -> list[Problem]:
    spec = registry.get(name)
    drawn: list[Problem] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None)
    @given(problems(spec, profile="nightly", explicit=False, dtypes=("float64",)))
    def collect(problem):
        drawn.append(problem)

    collect()
    return drawn


def test_nightly_draws_a_parallel_form_within_the_limit_and_a_recurrent_one_beyond():
    parallel = _nightly_draws("intree.retention_parallel")
    assert max(p.length for p in parallel) <= NIGHTLY_SQUARE
    assert max(p.length for p in parallel) > NIGHTLY_SQUARE // 2  # the limit is reached, not undercut
    recurrent = _nightly_draws("intree.retention_recurrent")
    assert max(p.length for p in recurrent) > NIGHTLY_SQUARE


def test_nightly_draws_a_chunkwise_form_at_long_lengths_with_chunks_within_the_limit():
    drawn = _nightly_draws("intree.retention_chunkwise")
    assert max(p.chunk_size for p in drawn) <= NIGHTLY_SQUARE
    assert max(p.length for p in drawn) > NIGHTLY_SQUARE  # the length itself is not limited


@pytest.mark.parametrize(("length", "largest"), [(32768, 3344), (100, 3344), (3344, 3344), (5, 1), (7, None)])
def test_chunk_sizes_stop_at_the_largest(length, largest):
    from harness.strategies import chunk_sizes

    strategy = chunk_sizes(length, (), largest=largest)
    drawn: list[int] = []

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(strategy)
    def collect(chunk):
        drawn.append(chunk)

    collect()
    top = length + 2 if largest is None else min(length + 2, largest)
    assert min(drawn) >= 1 and max(drawn) == top  # the largest allowed is drawn, nothing above it


def test_the_calibration_fits_a_long_problem_to_a_square_form(calibrate):
    """The nightly calibration's problem at L = 32,768 with a chunk of 13,810: the parallel form gets the
    longest length its (L x L) scores allow at the problem's batch x heads, the chunkwise form the
    length with the largest chunk allowed, the recurrent form the problem as drawn."""
    base = Problem(family="retention", length=32768, dtype="float32", batch=3, heads=4, dk=8, dv=8,
                   chunk_size=13810, seed=1)
    limit = square_scores_limit(12)
    parallel = calibrate._fit(base.replace(chunk_size=None), registry.get("intree.retention_parallel"))
    assert parallel.length == limit
    chunkwise = calibrate._fit(base, registry.get("intree.retention_chunkwise"))
    assert (chunkwise.length, chunkwise.chunk_size) == (32768, limit)
    recurrent = calibrate._fit(base.replace(chunk_size=None), registry.get("intree.retention_recurrent"))
    assert recurrent.length == 32768
    small = base.replace(length=100, chunk_size=33, batch=1, heads=1)  # far below: unchanged
    assert calibrate._fit(small, registry.get("intree.retention_chunkwise")) == small


_PEAK_SCRIPT = """
import resource, torch
from harness.kernels import retnet_forms
retnet_forms.INNER_BLOCK_ELEMENTS = 2**20  # one chunk of 1,024 at a time
c, L = 1024, 16384
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, L, 1, 2, generator=g, dtype=torch.float64) for _ in range(3))
one = retnet_forms.retention_chunkwise(q[:, :c], k[:, :c], v[:, :c], c)  # one chunk's own memory, touched
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
whole = retnet_forms.retention_chunkwise(q, k, v, c)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_the_chunkwise_form_holds_one_chunk_s_scores_at_a_time_not_the_sequence_s():
    """The nightly calibration's kill: `intree.retention_normed_chunkwise`, float64, L = 25,457, chunk 4,729
    (within the square budget) formed all six chunks' scores at once, 6.4 GB per tensor, and was killed
    for memory. Now its peak past one chunk's is flat in L: 16 chunks of 1,024 formed one at a time add
    nothing to the peak of one (231 MB when formed at once). glibc's dynamic mmap threshold is fixed so
    that freed blocks are returned and the peak is the kernel's, not the allocator's."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    grown_mib = float(done.stdout.split()[-1])
    assert grown_mib < 32, f"the peak grew {grown_mib:.0f} MiB past one chunk's"


def test_chunks_formed_in_groups_give_what_they_give_at_once(monkeypatch):
    """Grouping the chunks changes memory, not the algebra: the same outputs to rounding, any chunk count."""
    import torch

    from harness.kernels import retnet_forms

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 301, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    at_once = retnet_forms.retention_chunkwise(q, k, v, 16)
    monkeypatch.setattr(retnet_forms, "INNER_BLOCK_ELEMENTS", 2 * 3 * 16 * 16 * 3)  # three chunks a group
    grouped = retnet_forms.retention_chunkwise(q, k, v, 16)
    torch.testing.assert_close(grouped, at_once, rtol=1e-13, atol=1e-13)


def test_a_kernel_holding_every_chunk_at_once_is_limited_in_chunk_times_length():
    """torchscale's chunkwise form holds every chunk's scores together (memory in L x chunk): at L = 30,888
    and the square limit's chunk of 3,861 (batch 3 x heads 3, float64) it was killed for memory at 10.7 GB.
    Its chunk now shrinks with the length, and its drawn lengths with the chunk."""
    spec = registry.get("torchscale.chunkwise")
    caps = spec.capabilities
    assert caps.chunks_at_once
    killed = Problem(family="retention_normed", length=30888, dtype="float64", batch=3, heads=3, dk=65, dv=35,
                     chunk_size=3861, eps=0.0, seed=1975398264)
    from scripts.calibrate import _fit  # noqa: PLC0415 - the script, as the calibration runs it

    fitted = _fit(killed, spec)
    held = 8 * 9 * caps.square_matrices * fitted.chunk_size * fitted.length
    assert fitted.chunk_size < 3861 and fitted.length % fitted.chunk_size == 0
    assert held <= SQUARE_SCORES_BYTES < 8 * 9 * caps.square_matrices * (fitted.chunk_size + 1) * killed.length
    for chunk in (1, 64):
        longest = caps.longest_at_chunk(12, chunk)
        assert 8 * 12 * caps.square_matrices * chunk * longest <= SQUARE_SCORES_BYTES
    assert registry.get("yar.chunkwise").capabilities.longest_at_chunk(12, 64) is None  # one chunk at a time


_MEASURE_SCRIPT = """
import json, sys, torch
from harness.kernels import registry
from harness.problems import Problem
from harness.runner import call_args
from harness.kernels import retnet_forms

retnet_forms.INNER_BLOCK_ELEMENTS = 1  # one chunk's scores at a time: the group's own bound is fixed, not n's

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

n, chunks = int(sys.argv[1]), int(sys.argv[2])
for name in sys.argv[3:]:
    spec = registry.get(name)
    takes = spec.capabilities.takes_chunk
    normed = spec.family.value == "retention_normed"
    p = Problem(family=spec.family, length=chunks * n if takes else n, dtype="float64", batch=3, heads=3,
                dk=16, dv=16, chunk_size=n if takes else None, eps=0.0 if normed else None, seed=0)
    args, kwargs = call_args(p, p.make_inputs(), spec)
    fn = spec.callable()
    with torch.no_grad():
        fn(*args, **kwargs)  # imports and one-time set-up
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again here
    base = status("VmRSS")
    with torch.no_grad():
        fn(*args, **kwargs)
    print(json.dumps({"name": name, "length": p.length, "peak": status("VmHWM") - base}))
"""


def test_every_square_kernel_holds_no_more_than_it_declares():
    """The memory model the limit rests on, measured: a square kernel's peak past its inputs, at n = 400
    (chunk forms over four chunks; batch 3 x heads 3, head dims 16, float64), stays within its declared
    `square_matrices` (n x n) matrices per batch row and head, times L / n with `chunks_at_once`.
    Measured: 2.1-2.6 for the retention forms, 3.4 for the in-tree cumprod forms, and 8.9 for torchscale's
    chunkwise form (0.75 + 2.25 per chunk), against the four every kernel was assumed to hold."""
    import json
    import os
    import subprocess
    import sys

    names = [name for name in SQUARE if registry.get(name).unavailable_reason() is None]
    assert "intree.retention_parallel" in names
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    n, chunks = 400, 4
    done = subprocess.run([sys.executable, "-c", _MEASURE_SCRIPT, str(n), str(chunks), *names],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["name"] for r in rows] == names
    for r in rows:
        caps = registry.get(r["name"]).capabilities
        per_n2 = r["peak"] / (8 * 9 * n * n)
        declared = caps.square_matrices * (r["length"] / n if caps.chunks_at_once else 1)
        assert per_n2 <= declared, f"{r['name']}: {per_n2:.2f} (n x n) matrices per row held, {declared} declared"
