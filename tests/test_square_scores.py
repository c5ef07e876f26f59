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
from harness.kernels.contract import KernelSpec
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
          "torchscale.parallel", "torchscale.chunkwise", "yar.parallel", "yar.chunkwise",
          "mamba_ssm.ssd_chunk_scan_combined_ref", "mamba_ssm.ssd_minimal_discrete")


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
    return _nightly_draws_of(registry.get(name), n)


def _nightly_draws_of(spec, n: int) -> list[Problem]:
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
import resource, sys, torch
from harness.kernels import retnet_forms
c, L, d, first, block = (int(a) for a in sys.argv[1:])
retnet_forms.INNER_BLOCK_ELEMENTS = block
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, L, 1, d, generator=g, dtype=torch.float64) for _ in range(3))
one = retnet_forms.retention_chunkwise(q[:, :first], k[:, :first], v[:, :first], c)  # one group's memory, touched
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
whole = retnet_forms.retention_chunkwise(q, k, v, c)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def _chunkwise_peak_mib(chunk: int, length: int, head_dim: int, first: int, block: int) -> float:
    """`retention_chunkwise`'s peak RSS past a first call on ``first`` positions, in a fresh process
    (glibc's mmap threshold fixed, so that freed blocks are returned and the peak is the kernel's)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, *map(str, (chunk, length, head_dim, first, block))],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.e2e  # a fresh process per kernel, measuring its peak memory
def test_the_chunkwise_form_holds_one_chunk_s_scores_at_a_time_not_the_sequence_s():
    """The nightly calibration's kill: `intree.retention_normed_chunkwise`, float64, L = 25,457, chunk 4,729
    (within the square budget) formed all six chunks' scores at once, 6.4 GB per tensor, and was killed
    for memory. Now its peak past one chunk's is flat in L: 16 chunks of 1,024 formed one at a time add
    nothing to the peak of one (231 MB when formed at once)."""
    grown_mib = _chunkwise_peak_mib(1024, 16384, 2, 1024, 2**20)  # a group of one chunk of 1,024
    assert grown_mib < 32, f"the peak grew {grown_mib:.0f} MiB past one chunk's"


@pytest.mark.e2e  # a fresh process per kernel, measuring its peak memory
def test_the_chunkwise_form_holds_one_group_s_states_at_a_time_not_every_chunk_s():
    """The nightly calibration's kill at a chunk of 1 (seed 35): `intree.retention_chunkwise`, float64,
    L = 27,255, batch 3 x heads 3, formed every chunk's (dk x dv) state three times (contributions, the
    list of states, their stack; measured 3.1 per chunk: some 20 GB there) and was killed for memory.
    Now the states are formed group by group with the scores: at L = 4,096, chunk 1, dk = dv = 64, a
    group of 15 chunks adds a megabyte or two to the peak, where every chunk's states at once added
    411 MiB. (The nightly case itself now peaks at 1.3 GB in 15 s.)"""
    grown_mib = _chunkwise_peak_mib(1, 4096, 64, 64, 2**16)
    assert grown_mib < 32, f"the peak grew {grown_mib:.0f} MiB past a group's: every chunk's states at once"


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


def test_a_kernel_holding_every_chunk_at_once_is_limited_in_chunk_times_length(calibrate):
    """torchscale's chunkwise form holds every chunk's scores together (memory in L x chunk): at L = 30,888
    and the square limit's chunk of 3,861 (batch 3 x heads 3, float64) it was killed for memory at 10.7 GB.
    Its chunk now shrinks with the length, and its drawn lengths with the chunk."""
    spec = registry.get("torchscale.chunkwise")
    caps = spec.capabilities
    assert caps.chunks_at_once
    killed = Problem(family="retention_normed", length=30888, dtype="float64", batch=3, heads=3, dk=65, dv=35,
                     chunk_size=3861, eps=0.0, seed=1975398264)
    fitted = calibrate._fit(killed, spec)
    held = 8 * caps.held_elements(9, fitted.length, fitted.chunk_size, 65 * 35)
    assert fitted.chunk_size < 3861 and fitted.length % fitted.chunk_size == 0
    assert held <= SQUARE_SCORES_BYTES < 8 * 9 * caps.square_matrices * (fitted.chunk_size + 1) * killed.length
    for chunk in (1, 64):
        longest = caps.longest_at_chunk(12, chunk, 65 * 65)
        assert 8 * caps.held_elements(12, longest, chunk, 65 * 65) <= SQUARE_SCORES_BYTES
        assert 8 * caps.held_elements(12, longest + chunk, chunk, 65 * 65) > SQUARE_SCORES_BYTES  # the longest
    assert registry.get("yar.chunkwise").capabilities.longest_at_chunk(12, 64, 4225) is None  # one chunk at a time


def test_a_kernel_holding_every_chunk_s_state_gets_no_small_chunk_at_a_long_length(calibrate):
    """A chunk kernel that keeps each chunk's (dk x dv) state holds L / chunk of them: torchscale's chunkwise
    form measures 3.1-3.4 per chunk (`CHUNK_STATES`, 4, is what a kernel that declares nothing is assumed
    to hold), 20 GB at the nightly calibration's L = 27,255 with a chunk of 1 and head dims of 65. The
    draws keep the states within the budget: a small chunk gets a shorter sequence (or, where the
    length comes first, a long sequence a larger chunk); a kernel that carries one state is not limited."""
    from harness.kernels.contract import CHUNK_STATES, Capabilities

    default = Capabilities(chunk_sizes=())
    assert default.chunk_states == CHUNK_STATES == 4
    rows, elements = 9, 65 * 65
    smallest = default.smallest_chunk(rows, 27255, elements)
    assert 1 < smallest <= 27255
    assert 8 * default.held_elements(rows, 27255, smallest, elements) <= SQUARE_SCORES_BYTES
    assert 8 * default.held_elements(rows, 27255, smallest - 1, elements) > SQUARE_SCORES_BYTES
    carried = registry.get("intree.retention_chunkwise").capabilities
    assert carried.smallest_chunk(rows, 27255, elements) == 1 and carried.longest_at_chunk(rows, 1, elements) is None

    killed = Problem(family="retention", length=27255, dtype="float64", batch=3, heads=3, dk=65, dv=65,
                     chunk_size=1, seed=0)
    assert calibrate._fit(killed, registry.get("intree.retention_chunkwise")) == killed  # it now streams
    user = KernelSpec(name="user.chunkwise", family=killed.family, load=lambda: None, capabilities=default)
    assert calibrate._fit(killed, user).chunk_size == smallest
    normed = killed.replace(family="retention_normed", eps=0.0)
    torchscale = calibrate._fit(normed, registry.get("torchscale.chunkwise"))
    assert torchscale.chunk_size == 1 and torchscale.length < 27255
    assert 8 * registry.get("torchscale.chunkwise").capabilities.held_elements(9, torchscale.length, 1, elements) \
        <= SQUARE_SCORES_BYTES

    drawn = _nightly_draws_of(KernelSpec(name="user.chunkwise", family=killed.family, load=lambda: None,
                                         capabilities=default), 300)
    nightly_rows, nightly_elements = NIGHTLY.max_batch * NIGHTLY.max_heads, NIGHTLY.largest_state_elements
    assert max(p.length for p in drawn) > 16384 and min(p.chunk_size for p in drawn) == 1  # not limited beyond
    for p in drawn:
        assert 8 * default.held_elements(nightly_rows, p.length, p.chunk_size, nightly_elements) <= SQUARE_SCORES_BYTES


_PEAKS_SCRIPT = """
import json, sys, torch
from harness.kernels import registry, retnet_forms
from harness.problems import Problem
from harness.runner import call_args

retnet_forms.INNER_BLOCK_ELEMENTS = 1  # a group of one chunk: the group's own bound is fixed, not L's

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

length, chunk, d, warm = (int(a) for a in sys.argv[1:5])  # warm: the first call's length (0: the problem's)
for name in sys.argv[5:]:
    spec = registry.get(name)
    family, takes = spec.family.value, spec.capabilities.takes_chunk
    fields = dict(family=family, batch=3, heads=3, dk=d, dv=d, chunk_size=chunk if takes else None, seed=0,
                  dtype="float64" if "float64" in spec.capabilities.dtypes else "float32")  # counted in float64
    if family == "retention_normed":
        fields["eps"] = 0.0
    if family == "ssd":
        fields.update(groups=1, state=d)
    p = Problem(length=length if takes else chunk, **fields)
    first = p.replace(length=warm) if warm else p
    fn = spec.callable()
    args, kwargs = call_args(first, first.make_inputs(), spec)
    with torch.no_grad():
        fn(*args, **kwargs)  # imports and one-time set-up
    args, kwargs = call_args(p, p.make_inputs(), spec)
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again here
    base = status("VmRSS")
    with torch.no_grad():
        fn(*args, **kwargs)
    print(json.dumps({"name": name, "length": p.length, "peak": status("VmHWM") - base}))
"""


def _peaks(names: list[str], length: int, chunk: int, head_dim: int, warm: int = 0) -> list[dict]:
    """Each kernel's peak RSS past its inputs (batch 3 x heads 3, float64 where it runs it), in a fresh
    process, glibc's mmap threshold fixed so that freed blocks are returned and the peak is the kernel's.
    A first call on ``warm`` positions (0: the problem itself) takes the imports and one-time set-up."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _PEAKS_SCRIPT, *map(str, (length, chunk, head_dim, warm)), *names],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["name"] for r in rows] == names
    return rows


@pytest.mark.e2e  # a fresh process per kernel, measuring its peak memory
def test_every_square_kernel_holds_no_more_than_it_declares():
    """The memory model the limit rests on, measured: a square kernel's peak past its inputs, at n = 400
    (chunk forms over four chunks; batch 3 x heads 3, head dims 16, float64), stays within its declared
    `square_matrices` (n x n) matrices per batch row and head, times L / n with `chunks_at_once`.
    Measured: 2.1-2.6 for the retention forms, 3.4 for the in-tree cumprod forms, and 8.9 for torchscale's
    chunkwise form (0.75 + 2.25 per chunk), against the four every kernel was assumed to hold."""
    names = [name for name in SQUARE if registry.get(name).unavailable_reason() is None]
    assert "intree.retention_parallel" in names
    n, chunks = 400, 4
    rows = _peaks(names, chunks * n, n, 16)
    for r in rows:
        caps = registry.get(r["name"]).capabilities
        per_n2 = r["peak"] / (8 * 9 * n * n)
        declared = caps.square_matrices * (r["length"] / n if caps.chunks_at_once else 1)
        assert per_n2 <= declared, f"{r['name']}: {per_n2:.2f} (n x n) matrices per row held, {declared} declared"


#: Chunk kernels run on the CPU without an interpreter (the Triton kernels' lengths stay in the hundreds).
CHUNKED = ("intree.retention_chunkwise", "intree.retention_normed_chunkwise", "intree.simple_gla_chunk",
           "intree.gla_chunk", "intree.ssd_chunk", "torchscale.chunkwise", "yar.chunkwise",
           "mamba_ssm.ssd_chunk_scan_combined_ref", "mamba_ssm.ssd_minimal_discrete")


@pytest.mark.e2e  # a fresh process per kernel, measuring its peak memory
def test_every_chunk_kernel_holds_no_more_per_chunk_than_it_declares():
    """The per-chunk memory model, measured at a chunk of 1 (L = 1,024 chunks; batch 3 x heads 3, head dims
    32): a kernel's peak past its inputs stays within what it declares (`Capabilities.held_elements`:
    per-chunk states, chunk pairs) plus 16 (L x head dim) buffers per row and head, what any form holds
    (outputs, scaled and padded copies). Measured: torchscale 3.1 states per chunk (declares 4); the
    in-tree forms and yet-another-retnet's carry one state (declare 0), where the in-tree chunkwise form
    held 3.1 before it formed its states group by group."""
    names = [name for name in CHUNKED if registry.get(name).unavailable_reason() is None]
    assert "intree.retention_chunkwise" in names and "torchscale.chunkwise" in names
    length, d = 1024, 32
    rows = _peaks(names, length, 1, d, warm=8)  # warmed on 8 steps: a second call would reuse the heap's blocks
    for r in rows:
        caps = registry.get(r["name"]).capabilities
        declared = caps.held_elements(9, length, 1, d * d) + 9 * 16 * length * d  # float64 elements
        held = r["peak"] / 8
        assert held <= declared, f"{r['name']}: {held / (9 * length * d * d):.2f} states per chunk held; " \
                                 f"{caps.chunk_states} declared ({held:.3g} > {declared:.3g} elements)"


def test_a_chunk_past_a_kernel_s_longest_length_is_fitted_to_it(calibrate):
    """The nightly calibration handed mamba-ssm's ``ssd_minimal_discrete`` (lengths a multiple of the chunk, at
    most 4,096) a chunk of 6,688 at L = 1: its own assertion failed, a kernel_error of the harness's making.
    The chunk is now cut to the longest length first."""
    spec = registry.get("mamba_ssm.ssd_minimal_discrete")
    drawn = Problem(family="ssd", length=20000, dtype="float32", batch=1, heads=2, groups=1, dv=4, state=4,
                    chunk_size=6688, seed=0)
    fitted = calibrate._fit(drawn, spec)
    assert fitted.chunk_size <= fitted.length <= spec.capabilities.max_length
    assert fitted.length % fitted.chunk_size == 0


@pytest.mark.parametrize(("field", "value"), [("square_matrices", 0), ("chunk_states", -3), ("chunk_pairs", 1.5),
                                              ("chunk_states", True), ("skip_regimes", {"negative_steps": 1})])
def test_a_memory_count_that_would_let_every_draw_fit_is_refused_where_it_is_declared(field, value):
    from harness.errors import InvalidArgument
    from harness.kernels.contract import Capabilities

    with pytest.raises(InvalidArgument, match=f"Capabilities\\({field}="):
        Capabilities(chunk_sizes=(), **{field: value})


def test_a_declared_chunk_size_is_kept_at_a_short_length(calibrate):
    """The interpreted calibration's first kernel_errors: fla's chunk kernels (chunk sizes 16, 32, 64) were
    handed a chunk of 5 at L = 3 ("chunk_size must be a power of 2"): the fit clamped the declared chunk to the
    length's. A chunk is only raised to the smallest that fits the memory budget, within the declared sizes."""
    from harness.kernels.contract import Capabilities

    spec = KernelSpec(name="user.fixed_chunks", family="retention", load=lambda: None,
                      capabilities=Capabilities(chunk_sizes=(16, 32, 64)))
    drawn = Problem(family="retention", length=3, dtype="float32", batch=1, heads=2, dk=65, dv=65, chunk_size=5,
                    seed=0)
    assert calibrate._fit(drawn, spec).chunk_size == 16
    long = drawn.replace(length=32768, batch=3, heads=4)  # every chunk's state: 16 is too small, 32 fits
    assert spec.capabilities.smallest_chunk(12, 32768, 65 * 65) > 16
    assert calibrate._fit(long, spec).chunk_size == 32
