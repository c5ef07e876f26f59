"""Hypothesis strategies that build `Problem`s inside a kernel's declared capabilities.

Drawn so that shrinking gives the smallest failing case: every size shrinks towards 1, lengths mix
the interesting values (powers of two, their neighbours, primes) with plain integers, and small cases
may draw their element values through hypothesis (``explicit``), so a counterexample shrinks to simple
numbers such as 0, 1 and 0.5. Large cases draw a seed and generate their data from it.

All options are keyword-only and validated eagerly (an impossible request raises `InvalidArgument`
instead of returning an empty strategy).
"""

from __future__ import annotations

import math

from hypothesis import reject
from hypothesis import strategies as st

from harness import families
from harness.errors import InvalidArgument, ProblemTooLarge
from harness.kernels.contract import KernelSpec, Lengths
from harness.problems import Problem
from harness.settings import limits as profile_limits

#: Lengths worth trying first: small values, powers of two and their neighbours, primes.
SPECIAL_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 257, 509, 512,
                   1021, 1024, 2048, 4093, 4096, 8192, 16384, 32768, 65536)

#: Largest problem (in input elements) whose values hypothesis draws element by element.
EXPLICIT_MAX_ELEMENTS = 96

EPS_ZERO_AND_RANGE = (0.0, 1e-12, 1e-5)


def lengths(*, min_value: int = 1, max_value: int, pow2: bool = False) -> st.SearchStrategy[int]:
    """Sequence lengths in [min_value, max_value], special values first."""
    if max_value < min_value:
        raise InvalidArgument(f"max_value={max_value!r} must be at least min_value={min_value!r}")
    if pow2:
        exps = [e for e in range(0, 31) if min_value <= 2**e <= max_value]
        if not exps:
            raise InvalidArgument(f"no power of two lies in [{min_value}, {max_value}]")
        return st.sampled_from(exps).map(lambda e: 2**e)
    special = [n for n in SPECIAL_LENGTHS if min_value <= n <= max_value]
    ints = st.integers(min_value, max_value)
    return st.one_of(st.sampled_from(special), ints) if special else ints


def epsilons() -> st.SearchStrategy[float]:
    """Norm eps: exactly 0, or log-uniform in [1e-12, 1e-5]."""
    return st.one_of(st.just(0.0), st.floats(-12.0, -5.0).map(lambda e: float(f"{10.0 ** e:.3g}")))


def chunk_sizes(length: int, allowed: tuple[int, ...], largest: int | None = None,
                smallest: int = 1) -> st.SearchStrategy[int]:
    """Chunk sizes: 1, 2, odd, the length itself, larger than it, and ones that do not divide it; none
    above ``largest`` (a kernel whose memory is square in its chunk, `Capabilities.square_scores`) and none
    below ``smallest`` (one that holds every chunk's state, `Capabilities.smallest_chunk`) unless that
    leaves none."""
    if allowed:
        return st.sampled_from([c for c in sorted(allowed) if c >= smallest] or [max(allowed)])
    top = max(1, length + 2 if largest is None else min(length + 2, largest))
    low = min(smallest, top)
    options = sorted(c for c in {1, 2, 3, 4, 5, 7, 8, 16, 64, length, length + 1, max(1, length // 2)}
                     if low <= c <= top)
    return st.one_of(st.sampled_from(options), st.integers(low, top))


#: Products of up to this many factors (data, decays, scales) stay normal when every nonzero explicit
#: value is at least `value_floor` in magnitude.
FACTORS = 4


def value_floor(dtype: str) -> float:
    """The smallest magnitude of a nonzero explicit value in ``dtype``: ``2 * smallest_normal**(1/4)``, so
    that a product of up to `FACTORS` of them is a normal number. Below it an intermediate product
    can land among the subnormals, where a rounding is not relative to the value (``u |x|``) but absolute
    (half the subnormal spacing), and a later large factor multiplies it: with q = 1, k = 2**-149 (the
    smallest float32 subnormal) and v = 2.9e7, fla's ``naive_chunk_simple_gla`` scales q before the dot,
    rounds 0.71 * 2**-149 up to 2**-149 and returns 4.0e-38 for 2.8e-38. That is IEEE arithmetic, not a
    bug in the kernel, and no bound in units of u covers it; the regimes' own data never come near it."""
    from harness.dtypes import info

    return 2.0 * info(dtype).smallest_normal ** (1.0 / FACTORS)


def _nonzero_at_least(lo: float, hi: float, floor: float) -> st.SearchStrategy[float]:
    """Floats in [lo, hi] that are 0 or at least ``floor`` in magnitude."""
    parts = []
    if lo <= 0.0 <= hi:
        parts.append(st.just(0.0))
    if hi >= max(lo, floor):
        parts.append(st.floats(max(lo, floor), hi, allow_nan=False, allow_infinity=False))
    if lo <= min(hi, -floor):
        parts.append(st.floats(lo, min(hi, -floor), allow_nan=False, allow_infinity=False))
    if not parts:  # a range inside (-floor, floor) without 0: its own values
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return st.one_of(parts)


@st.composite
def explicit_values(draw, problem: Problem) -> dict[str, list[float]]:
    """Element values for a small problem, each input inside its regime's range, each nonzero one at
    least `value_floor` of the problem's dtype in magnitude."""
    out = {}
    floor = value_floor(problem.dtype)
    for name, shape in problem.shapes().items():
        lo, hi = problem.definition.element_bounds(problem, name)
        elem = _nonzero_at_least(lo, hi, floor)
        out[name] = draw(st.lists(elem, min_size=math.prod(shape), max_size=math.prod(shape)))
    return out


def searched_regimes(spec: KernelSpec, regimes: tuple[str, ...] | None = None) -> list[str]:
    """The input regimes a search of ``spec`` draws from: its family's (or those of ``regimes`` that apply), less
    those the kernel skips (`Capabilities.skip_regimes`)."""
    applies = families.get(spec.family).regimes
    return [r for r in (regimes or applies) if r in applies and r not in spec.capabilities.skip_regimes]


@st.composite
def problems(draw, spec: KernelSpec, *, dtypes: tuple[str, ...] | None = None, device: str = "cpu",
             regimes: tuple[str, ...] | None = None, max_length: int | None = None,
             explicit: bool = True, profile: str | None = None) -> Problem:
    """A `Problem` for ``spec``, inside its capabilities and the profile's limits."""
    caps = spec.capabilities
    lim = profile_limits(profile)
    fam = spec.family
    ok_dtypes = [d for d in (dtypes or caps.dtypes) if caps.runs(d, device) is None]
    if not ok_dtypes:
        raise InvalidArgument(f"kernel {spec.name!r} runs none of dtypes={dtypes or caps.dtypes!r} on {device!r}")
    ok_regimes = searched_regimes(spec, regimes)
    if not ok_regimes:
        raise InvalidArgument(f"regimes={regimes!r} has none that applies to family {fam.value} and kernel "
                              f"{spec.name!r} (it skips {sorted(caps.skip_regimes)})")
    top = max_length or lim.max_length
    if caps.max_length is not None:
        top = min(top, caps.max_length)
    square = caps.largest_square(lim.max_batch * lim.max_heads)  # bounds the chunk, or else the length
    if square is not None and not caps.takes_chunk:
        top = min(top, square)
    if top < caps.min_length:
        raise InvalidArgument(f"max_length={top} is below kernel {spec.name!r}'s min_length={caps.min_length}")

    # Drawn first and always, so that the shape of the choice sequence does not depend on the sizes:
    # otherwise a smaller case that becomes eligible for explicit values draws one more choice and
    # hypothesis (which minimizes the choice sequence, shortest first) refuses to shrink into it.
    want_values = draw(st.booleans()) if explicit else False
    dtype = draw(st.sampled_from(ok_dtypes))
    regime = draw(st.sampled_from(ok_regimes))
    chunk = None
    rows, state_elements = lim.max_batch * lim.max_heads, lim.largest_state_elements  # memory at the largest
    if caps.lengths is Lengths.CHUNK_MULTIPLE:
        chunk = draw(st.sampled_from(caps.chunk_sizes) if caps.chunk_sizes else st.integers(1, 64))
        longest = caps.longest_at_chunk(rows, chunk, state_elements)  # every chunk's scores or states at once
        n_chunks = draw(st.integers(1, max(1, min(top, longest or top) // chunk)))
        length = chunk * n_chunks
    else:
        length = draw(lengths(min_value=caps.min_length, max_value=top, pow2=caps.lengths is Lengths.POW2))
        if caps.takes_chunk:
            chunk = draw(chunk_sizes(length, caps.chunk_sizes, largest=caps.largest_square(rows, length),
                                     smallest=caps.smallest_chunk(rows, length, state_elements)))
    fields: dict = dict(family=fam, length=length, dtype=dtype, device=device, regime=regime, chunk_size=chunk,
                        batch=draw(st.integers(1, lim.max_batch)), seed=draw(st.integers(0, 2**31 - 1)),
                        range_dtype=caps.range_dtype(dtype))
    fields.update(families.get(fam).draw_fields(draw, caps, lim, regime, fields))
    try:
        problem = Problem(**fields)
    except ProblemTooLarge:  # only under a max_length far beyond the profiles' (they stay well below)
        reject()
    if want_values and regime not in ("ramp",) and problem.n_elements() <= EXPLICIT_MAX_ELEMENTS:
        problem = problem.replace(values=draw(explicit_values(problem)), seed=0)
    return problem
