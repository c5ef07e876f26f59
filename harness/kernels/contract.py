"""The kernel contract: the kernel families, their call signatures, and what an adapter declares.

A kernel belongs to one `Family` and is a callable with that family's signature. The harness hands it
tensors in the case's dtype on the case's device and expects the documented output shape back:

- ``linear_scan``: ``fn(a, b) -> h``; a, b (batch, channels, length); ``h_t = a_t * h_{t-1} + b_t``,
  ``h_{-1} = 0``.
- ``selective_scan``: ``fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False) -> y``
  with the layout and meaning of mamba-ssm's ``selective_scan_fn``: u, delta (batch, dim, L); A (dim, N);
  B, C (batch, N, L) or grouped (batch, G, N, L); D (dim,); z (batch, dim, L); delta_bias (dim,).
- ``retention``: ``fn(q, k, v) -> o``; q, k (batch, L, heads, dk), v (batch, L, heads, dv); per-head decay
  ``gamma_h = 1 - 2**(-5 - h)`` and scale ``dk**-0.5`` unless the spec declares another convention.
- ``retention_normed``: ``fn(q, k, v, eps) -> o``: the same followed by the per-head RMS group norm.
- ``simple_gla``: ``fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False) -> (o, final_state)``
  in fla's layout: q, k (batch, T, heads, K), v (batch, T, heads, V), g (batch, T, heads) the log-decay;
  ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``, ``o_t = scale * q_t S_t``, ``S_{-1} = initial_state or 0``,
  scale ``K**-0.5`` by default; ``cu_seqlens=`` for kernels that declare variable-length batches.
- ``gla``: the same with g (batch, T, heads, K): ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``.
- ``ssd``: Mamba-2's ``fn(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
  initial_states=None, seq_idx=None) -> y`` in mamba-ssm's layout (``mamba_chunk_scan_combined``).
  The oracles are in ``reference_impls.gated_decay``.

Kernels that take a chunk size accept ``chunk_size=`` as a keyword; the harness draws it.

A `KernelSpec` is what a module registers. It never imports the third-party package itself: ``load``
does, lazily, and raises `KernelUnavailable` with the reason when it cannot. Any other exception a
``load`` raises (a failed nvcc build's ``RuntimeError``, an ``OSError`` without ``CUDA_HOME``) also makes
the kernel unavailable, with that error as the reason: loading is the kernel's business, never the run's.

``KernelSpec.callable()`` hands out the loaded kernel wrapped by `on_device`: for CUDA inputs it makes
the inputs' device current and synchronizes before returning, so that an asynchronous failure or hang
surfaces inside the guarded call (and its timeout), and a call's time is the kernel's, not its launch's.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels.names import ALL_DTYPES, Family


class Lengths(str, enum.Enum):
    """Which sequence lengths a kernel accepts."""

    ANY = "any"
    POW2 = "pow2"
    CHUNK_MULTIPLE = "chunk_multiple"


DTYPE_NAMES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ALL_DTYPES}


def dtype_name(dtype: torch.dtype | str) -> str:
    """`torch.float32` -> ``"float32"``; validates names."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise InvalidArgument(f"dtype={dtype!r} is not supported; expected one of {list(DTYPE_NAMES)}")
        return dtype
    for name, dt in DTYPE_NAMES.items():
        if dt == dtype:
            return name
    raise InvalidArgument(f"dtype={dtype!r} is not supported; expected one of {list(DTYPE_NAMES)}")


def retnet_gammas(heads: int) -> tuple[float, ...]:
    """RetNet's per-head decay: ``gamma_h = 1 - 2**(-5 - h)`` for h = 0..heads-1."""
    return tuple(1.0 - 2.0 ** (-5 - h) for h in range(heads))


def inverse_sqrt_scale(dk: int) -> float:
    """RetNet's query scale ``dk ** -0.5``."""
    return dk**-0.5


#: Memory the strategies allow the (n x n) float64 matrices of a kernel that declares
#: `Capabilities.square_scores`, per case at the profile's largest batch x heads: `square_matrices` of
#: them per batch row and head (scores, decay mask, their product, ...) stay within 4 GiB.
SQUARE_SCORES_BYTES = 2**32

#: The (n x n) matrices per batch row and head a square kernel is assumed to hold at its peak when it
#: declares no count: what the in-tree, yet-another-retnet and torchscale parallel forms measure (2.5 to 4).
SQUARE_MATRICES = 4

#: The per-chunk states (one batch row and head's, dk x dv; headdim x N for SSD) a chunk kernel is assumed
#: to hold at its peak, for every chunk at once, when it declares no count: a kernel that keeps each
#: chunk's state (torchscale's ``kv``, the list of running states and their stack) measures 3.1 to 3.4.
CHUNK_STATES = 4

#: The (chunks x chunks) matrices per batch row and head a chunk kernel is assumed to hold when it declares
#: no count: the decays between every pair of chunks, as mamba-ssm's SSD references and the Mamba-2 paper's
#: Listing 1 (which its users copy) form them; at a chunk of 1 both stay within the defaults of states and
#: pairs together (`tests/test_square_scores.py`).
CHUNK_PAIRS = 4


def square_scores_limit(rows: int, matrices: int = SQUARE_MATRICES, length: int | None = None) -> int:
    """The largest n whose ``matrices`` (n x n) float64 matrices for ``rows`` (batch rows x heads) fit
    `SQUARE_SCORES_BYTES`: 3,344 for the nightly profile's 3 x 4 at four matrices, 4,729 for ci's 2 x 3.

    With ``length``, the kernel holds every chunk's matrices at once (``Capabilities.chunks_at_once``),
    ``length / n`` chunks of them: the largest n whose ``matrices`` (n x max(n, length)) blocks fit.
    """
    per_matrix = SQUARE_SCORES_BYTES // (8 * max(1, rows) * max(1, matrices))
    largest = math.isqrt(per_matrix)
    if length is not None:
        largest = min(largest, per_matrix // max(1, length))
    return max(1, largest)


@dataclass(frozen=True)
class Capabilities:
    """What a kernel supports; the strategies draw only inside it.

    ``dtypes`` and ``devices`` list what the kernel is run on; ``unsupported`` maps a dtype name, device
    or ``"dtype@device"`` (e.g. ``"bfloat16@cpu"``) to the reason it is left out, so that a limitation
    of the environment (e.g. the Triton interpreter) is reported as such and not as a kernel bug.
    ``chunk_sizes``: None when the kernel takes no ``chunk_size``; an empty tuple when any positive
    chunk size works; otherwise the allowed values.
    """

    dtypes: tuple[str, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    lengths: Lengths = Lengths.ANY
    min_length: int = 1
    max_length: int | None = None
    chunk_sizes: tuple[int, ...] | None = None
    autograd: bool = False
    grouped_bc: bool = True  # selective_scan: accepts B/C of shape (batch, G, N, L)
    selective_options: bool = True  # selective_scan: accepts D, z, delta_bias, delta_softplus
    max_state: int | None = None  # selective_scan: largest N; retention: largest dk/dv
    head_dims: tuple[int, ...] | None = None  # retention: allowed dk/dv values (None: any)
    #: dk and dv are drawn as multiples of this (fla's chunk backward asserts even K and V in 16-bit dtypes, which a
    #: GPU's tl.dot sizes always are and the interpreter's free sizes are not).
    head_dim_multiple: int = 1
    unsupported: dict[str, str] = field(default_factory=dict)
    #: Input regimes the kernel is not defined on, with the reason; the strategies, sweeps and calibration do
    #: not draw them for it (mamba-ssm's PyTorch SSD references take a negative step as given, where its
    #: kernels clamp it to 0: ``{"negative_steps": ...}``).
    skip_regimes: dict[str, str] = field(default_factory=dict)
    slow: bool = False  # run by an interpreter (Triton on the CPU): the suite draws fewer, shorter cases
    #: Declared internal precision: input dtype -> the dtype the kernel really computes in (e.g.
    #: ``{"float64": "float32"}`` for a kernel whose norm or state is float32 whatever the input). The
    #: case still runs in the input dtype; the verdict holds it to the declared precision's rounding and
    #: the report shows the declaration, so the floor it causes is explained, not hidden. Coarser only: a kernel
    #: that works in a finer dtype and returns the input's needs none, and declaring one is refused.
    computes_in: dict[str, str] = field(default_factory=dict)
    #: Chunk kernels: input dtype -> the dtype the kernel forms its cumulative log-decays (and the exp of
    #: their differences) in, when finer than ``precision`` (fla's and mamba-ssm's chunk kernels: float32 for
    #: float16 and bfloat16 inputs). The bound's chunk term, u times the within-chunk log-decay mass, is then
    #: charged at that dtype's u (`harness.runner.chunk_term_at`): in bfloat16 at its own u a chunk of 64
    #: steps left no guaranteed digit in 40-80% of a nightly search's cases (precision_exhausted), where the
    #: kernel loses none. A kernel that declares it and forms them in the input dtype is divergent.
    chunk_computes_in: dict[str, str] = field(default_factory=dict)
    #: Chunk kernels whose decays between chunks are exponents of differences of cumulative sums over the
    #: whole sequence, not a product of per-chunk factors (mamba-ssm's ``state_passing_ref``: ``exp(cumsum_t -
    #: cumsum_s)`` over every pair of chunks): each carries ``u`` times the log-decay mass since the sequence's
    #: start, so the chunk term is charged as for one chunk of the whole length. Found at a chunk of 1 in
    #: float32 (L = 35, mass 36): 11.5 times the float32 loop's error, called a kernel_bug. A parallel form
    #: with one cumulative sum over the sequence (``exp(G_t - G_s)``, no chunk size) declares it too.
    decays_across_chunks: bool = False
    #: retention_normed: the norm eps values at which the kernel is the oracle's function (None: any).
    #: A kernel that rescales rows before its norm agrees with the plain normed retention only at
    #: eps = 0; the suite then draws eps = 0, and sweeps show the eps effect separately.
    eps_values: tuple[float, ...] | None = None
    #: Whether float32 work goes through matmuls/dots (``torch.matmul``, ``einsum``, Triton's ``tl.dot``),
    #: which TF32 may round on tensor cores. None: the family's default (`KernelSpec.uses_matmuls`).
    #: The GPU sweep plans the TF32 axis only for kernels where this holds: for a scan the flags change
    #: nothing, and TF32's bound is 8192 times float32's.
    matmuls: bool | None = None
    #: Gated families (simple_gla, gla, ssd): whether the kernel takes an initial state, returns the final
    #: state when asked (``output_final_state=True`` / ``return_final_states=True``), and accepts packed
    #: variable-length batches (``cu_seqlens``, or ssd's ``seq_idx``). The strategies draw each only where
    #: it is declared, so a kernel without them is never handed one.
    initial_state: bool = False
    final_state: bool = False
    varlen: bool = False
    #: simple_gla, gla: whether the kernel takes ``scale`` (fla's signature); cases then pass one now and then
    #: (`harness.families.simple_gla.SCALES`), so that a kernel that ignores it is found.
    scale: bool = False
    #: The kernel forms an (n x n) matrix per batch row and head, n its chunk size if it takes one, else
    #: the length (a parallel retention form's ``(q k^T) * D``; a chunkwise form's within-chunk scores).
    #: Its memory grows with n squared, so the strategies draw n only up to `square_scores_limit` at the
    #: profile's largest batch x heads (nightly: 3,344; the ci profile's lengths stay below it): beyond,
    #: a correct kernel is killed for memory (at L = 32,768: 8.6 GB per head in float64), a
    #: kernel_error that says nothing about its numerics.
    square_scores: bool = False
    #: How many such (n x n) matrices, counted in float64, the kernel holds per batch row and head (and per
    #: chunk, with ``chunks_at_once``) at its peak; the limit shrinks with it (measured:
    #: ``tests/test_square_scores.py``).
    square_matrices: int = SQUARE_MATRICES
    #: The kernel forms every chunk's matrices together, so its memory grows with L x chunk, not chunk
    #: squared (torchscale's ``chunk_recurrent_forward``: about 0.75 + 2.25 L/chunk matrices per batch row
    #: and head; at L = 30,888, chunk 3,861 within the square limit, it was killed for memory).
    chunks_at_once: bool = False
    #: A chunk kernel's states held for every chunk at once, per batch row and head (`CHUNK_STATES`; 0 for
    #: a kernel that carries one state from chunk to chunk): L / chunk of them, so a small chunk at a long
    #: length is what fills memory (the nightly calibration: the in-tree chunkwise form at L = 27,255 with
    #: a chunk of 1 held three per chunk, some 20 GB, and was killed for memory).
    chunk_states: int = CHUNK_STATES
    #: A chunk kernel's (chunks x chunks) matrices per batch row and head (`CHUNK_PAIRS`; 0 for none).
    chunk_pairs: int = CHUNK_PAIRS
    notes: str = ""
    #: The options of the family's signature (``initial_state``, ``scale``, ``chunk_size``, ...) that no case passes
    #: because the kernel's signature hides whether it takes them (``*args`` / ``**kwargs``, or none readable):
    #: read from it by `harness.signatures`, and named under `harness check`'s searches as not tested.
    untested_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """The dtypes, memory counts and skipped regimes a kernel declares, checked where they are declared: an
        unknown dtype would fail every search as a usage error, a negative count would let every draw fit."""
        if isinstance(self.dtypes, (list, tuple)) and all(isinstance(d, str) for d in self.dtypes):
            object.__setattr__(self, "dtypes", tuple(self.dtypes))
            bad = [d for d in self.dtypes if d not in ALL_DTYPES]
        else:
            bad = self.dtypes
        if bad or not self.dtypes:
            what = f"{bad!r} not known" if bad else "none given"
            raise InvalidArgument(f"Capabilities(dtypes={self.dtypes!r}): {what}; expected a tuple of names from "
                                  f"{list(ALL_DTYPES)}")
        held = "how many such matrices the kernel holds at its peak"
        for name, least, what in (("square_matrices", 1, held), ("chunk_states", 0, held), ("chunk_pairs", 0, held),
                                  ("head_dim_multiple", 1, "the multiple every dk and dv is drawn as")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgument(f"Capabilities({name}={value!r}): expected an int >= {least} ({what})")
        self._check_precisions()
        if not isinstance(self.skip_regimes, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.skip_regimes.items()):
            raise InvalidArgument(f"Capabilities(skip_regimes={self.skip_regimes!r}): expected a dict of regime name "
                                  "-> the reason the kernel is not defined on it")

    def _check_precisions(self) -> None:
        """``computes_in`` declares a coarser precision than the input's (a float32 norm for float64 inputs, TF32's
        dots for float32 ones). A finer one was accepted and made a correct kernel fail: a bfloat16 loop that
        accumulates in float32 declared ``{"bfloat16": "float32"}`` and was held to float32's bound, with nothing
        for its output's rounding to bfloat16, 1,980 times over it at L = 1 (a blind hunt, session 25). The output
        is stored in the input dtype, whose rounding the bound already charges: finer work needs no declaration."""
        from harness import dtypes

        for name in ("computes_in", "chunk_computes_in"):
            table = getattr(self, name)
            if not isinstance(table, dict):
                raise InvalidArgument(f"Capabilities({name}={table!r}): expected a dict of input dtype -> dtype")
            for key, value in table.items():
                try:
                    finer = dtypes.unit_roundoff(value) < dtypes.unit_roundoff(key)
                except (KeyError, TypeError, ValueError, InvalidArgument):
                    raise InvalidArgument(f"Capabilities({name}={table!r}): {key!r} -> {value!r} is not a pair of "
                                          f"dtype names; expected names from {sorted(dtypes.DTYPES)}") from None
                if finer and name == "computes_in":
                    raise InvalidArgument(
                        f"Capabilities(computes_in={table!r}): {value} is finer than {key}; computes_in declares a "
                        f"coarser precision than the input's (e.g. {{'float64': 'float32'}}). A kernel that works in "
                        f"{value} and returns {key} needs no declaration: its output is stored in {key}, whose "
                        f"rounding the bound charges; a chunk kernel forming its decays in {value} declares "
                        f"chunk_computes_in={{{key!r}: {value!r}}}")
                if not finer and value != key and name == "chunk_computes_in":
                    raise InvalidArgument(
                        f"Capabilities(chunk_computes_in={table!r}): {value} is not finer than {key}; "
                        "chunk_computes_in declares decays formed in a finer dtype than the input's (e.g. "
                        "{'bfloat16': 'float32'}); a coarser precision of the whole kernel is computes_in")

    def largest_square(self, rows: int, length: int | None = None) -> int | None:
        """The largest n (chunk or length, see `square_scores`) to draw for ``rows`` batch rows x heads
        (and, for a kernel that holds all its chunks at once, a sequence of ``length``); None when the
        kernel's memory is not square in it."""
        if not self.square_scores:
            return None
        return square_scores_limit(rows, self.square_matrices, length if self.chunks_at_once else None)

    def held_elements(self, rows: int, length: int, chunk: int, state_elements: int) -> int:
        """The elements (counted in float64) the kernel is assumed to hold at its peak for ``rows`` batch rows
        x heads, a sequence of ``length`` in chunks of ``chunk``, states of ``state_elements`` each: its
        square scores (`square_scores`, every chunk's with `chunks_at_once`), its per-chunk states
        (`chunk_states`) and its (chunks x chunks) matrices (`chunk_pairs`). The strategies keep it within
        `SQUARE_SCORES_BYTES`."""
        n = -(-length // max(1, chunk))
        square = 0
        if self.square_scores:
            square = self.square_matrices * chunk * (n * chunk if self.chunks_at_once else chunk)
        return max(1, rows) * square + self._per_chunk_elements(rows, n, state_elements)

    def _per_chunk_elements(self, rows: int, chunks: int, state_elements: int) -> int:
        return max(1, rows) * (self.chunk_states * chunks * state_elements + self.chunk_pairs * chunks * chunks)

    def longest_at_chunk(self, rows: int, chunk: int, state_elements: int) -> int | None:
        """The longest sequence, a multiple of ``chunk``, to draw with ``chunk`` (`held_elements` within the
        budget; at least one chunk); None when the kernel's memory does not grow with the length at a
        fixed chunk (it takes no chunk, or forms one chunk at a time and carries one state)."""
        if not self.takes_chunk or not (self.chunks_at_once and self.square_scores or self.chunk_states
                                        or self.chunk_pairs):
            return None
        lo, hi = 1, 2**40 // max(1, chunk)  # chunks: lo fits (or nothing does), hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            fits = 8 * self.held_elements(rows, mid * chunk, chunk, state_elements) <= SQUARE_SCORES_BYTES
            lo, hi = (mid, hi) if fits else (lo, mid)
        return lo * chunk

    def smallest_chunk(self, rows: int, length: int, state_elements: int) -> int:
        """The smallest chunk whose per-chunk states and (chunks x chunks) matrices for ``length`` fit the
        budget: 1 for a kernel that holds neither, at most ``length`` (one chunk)."""
        if not self.takes_chunk or not (self.chunk_states or self.chunk_pairs):
            return 1
        lo, hi = 0, max(1, length)  # chunk sizes: lo does not fit (0: none), hi fits or is one chunk
        while hi - lo > 1:
            mid = (lo + hi) // 2
            fits = 8 * self._per_chunk_elements(rows, -(-length // mid), state_elements) <= SQUARE_SCORES_BYTES
            lo, hi = (lo, mid) if fits else (mid, hi)
        return hi

    @property
    def takes_chunk(self) -> bool:
        return self.chunk_sizes is not None

    def precision(self, dtype: str) -> str:
        """The dtype whose rounding the verdict expects for inputs of ``dtype``."""
        return self.computes_in.get(dtype, dtype)

    def chunk_precision(self, dtype: str) -> str:
        """The dtype whose rounding the bound's chunk term is charged at for inputs of ``dtype``."""
        return self.chunk_computes_in.get(dtype, self.precision(dtype))

    def range_dtype(self, dtype: str) -> str | None:
        """The storage dtype the kernel computes inputs of ``dtype`` in, when its range differs from
        ``dtype``'s (torchscale: float64 in float32); None otherwise (TF32 is float32's range). A problem
        for the kernel scales its ``large``/``tiny`` regimes to it (`harness.problems.Problem.range_dtype`)."""
        from harness import dtypes

        storage = dtypes.dtype_key(dtypes.torch_dtype(self.precision(dtype)))
        return None if storage == dtypes.dtype_key(dtype) else storage

    def runs(self, dtype: str, device: str) -> str | None:
        """None if (dtype, device) is in range, else the reason it is not (``"cuda:1"`` is a ``"cuda"`` device)."""
        device = device.split(":", 1)[0]
        for key in (f"{dtype}@{device}", dtype, device):
            if key in self.unsupported:
                return self.unsupported[key]
        if dtype not in self.dtypes:
            return f"dtype {dtype} is not among the declared dtypes {list(self.dtypes)}"
        if device not in self.devices:
            return f"device {device} is not among the declared devices {list(self.devices)}"
        return None

    def fit_head_dim(self, d: int) -> int:
        """Head dim ``d`` (dk or dv) where the kernel takes it: the nearest of ``head_dims`` when it lists them,
        else ``d`` rounded down to a multiple of ``head_dim_multiple`` (at least one multiple)."""
        if self.head_dims:
            return min(self.head_dims, key=lambda h: abs(h - d))
        m = self.head_dim_multiple
        return max(m, d // m * m)

    def accepts_length(self, length: int, chunk_size: int | None = None) -> bool:
        if length < self.min_length or (self.max_length is not None and length > self.max_length):
            return False
        if self.lengths is Lengths.POW2:
            return length & (length - 1) == 0
        if self.lengths is Lengths.CHUNK_MULTIPLE:
            return chunk_size is not None and length % chunk_size == 0
        return True


@dataclass(frozen=True)
class RetentionConvention:
    """How a retention kernel defines decay and scale; the oracle follows the declaration.

    ``gammas(heads)`` gives the per-head decay, ``scale(dk)`` the factor on ``q S``.
    """

    gammas: Callable[[int], Sequence[float]] = retnet_gammas
    scale: Callable[[int], float] = inverse_sqrt_scale
    name: str = "retnet"


RETNET = RetentionConvention()


@dataclass(frozen=True)
class KernelSpec:
    """One kernel the harness can drive.

    ``load()`` returns the callable with the family's signature (importing its package lazily) or
    raises `KernelUnavailable`. ``name`` is dotted: ``<source>.<form>`` (``intree.blelloch``,
    ``mambapy.pscan``).
    """

    name: str
    family: Family
    load: Callable[[], Callable]
    capabilities: Capabilities = field(default_factory=Capabilities)
    convention: RetentionConvention = RETNET
    description: str = ""
    source: str = "intree"  # "intree", a third-party package name, "user" or "entry-point:<dist>"

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", Family.parse(self.family))

    @property
    def uses_matmuls(self) -> bool:
        """``capabilities.matmuls`` when declared; otherwise the family's default (`harness.families`: True
        for the retention families, whose q k^T and scores v are matmuls in every form; False for the
        scans, elementwise recurrences)."""
        if self.capabilities.matmuls is not None:
            return self.capabilities.matmuls
        from harness import families

        return families.get(self.family).uses_matmuls

    def unavailable_reason(self) -> str | None:
        """None when the kernel loads here, else the reason (cached per process)."""
        try:
            _load_cached(self)
        except KernelUnavailable as exc:
            return exc.reason
        return None

    def callable(self) -> Callable:
        """The loaded kernel wrapped by `on_device`; raises `KernelUnavailable` with the reason."""
        return _load_cached(self)


#: Loaded kernels by (name, id of the spec's loader), each kept with its loader: while an entry holds the
#: loader, no other object can take its id. (Keyed by the id alone, a user's second kernel of the same name,
#: whose loader was made after the first spec was freed, could get the first one's id and so its kernel: the
#: second of two `user_kernel_spec` closures named ``scan`` ran the first.)
_LOADED: dict[tuple[str, int], tuple[Callable, Callable | KernelUnavailable]] = {}


def package_version(source: str) -> str:
    """``<dist> <version>`` for a kernel from an installed distribution, else "": a package that fails to
    load often does so only in some of its published versions (fla-core 0.5.x does not import under
    triton 3.9: an autotuner key names a parameter its kernel lacks). When its import name is answered by
    another copy first on ``sys.path`` (an older ``flash-linear-attention`` with the same ``fla``, a
    folder on PYTHONPATH), that copy is named too: the installed version is then not what failed."""
    from importlib import metadata

    if source in ("intree", "user") or source.startswith("entry-point:"):
        return ""
    try:
        dist = metadata.distribution(source)
    except (metadata.PackageNotFoundError, ValueError):
        return ""
    return f"{source} {dist.version}{_imported_elsewhere(dist)}"


def _with_version(source: str) -> str:
    """`` with `` `package_version`, or ""."""
    text = package_version(source)
    return f" with {text}" if text else ""


def _top_level_names(dist) -> list[str]:
    """The import names a distribution installs (``top_level.txt``, else the first parts of its files)."""
    listed = (dist.read_text("top_level.txt") or "").split()
    if listed:
        return listed
    names = {str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")}
    return sorted(n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".egg-info", ".pth"))
                  and "." not in n.removesuffix(".py") and n != "__pycache__")


def _imported_elsewhere(dist) -> str:
    """`` (but <name> is imported from <dir>: <other dist> <version>)`` when an import name of ``dist``
    resolves outside its install location, else ""."""
    import importlib.util
    from importlib import metadata
    from pathlib import Path

    home = Path(str(dist.locate_file(""))).resolve()
    for name in _top_level_names(dist):
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = found.origin if found is not None and found.has_location else None
        if origin is None or Path(origin).resolve().is_relative_to(home):
            continue
        where = Path(origin).resolve().parent if Path(origin).name == "__init__.py" else Path(origin).resolve()
        owner = ""
        for other in metadata.distributions():
            base = Path(str(other.locate_file(""))).resolve()
            if where.is_relative_to(base) and name in _top_level_names(other):
                owner = f": {other.metadata['Name']} {other.version}"
                break
        return f" (but {name!r} is imported from {where}{owner})"
    return ""


def _load_cached(spec: KernelSpec) -> Callable:
    key = (spec.name, id(spec.load))
    if key not in _LOADED:
        try:
            value = on_device(spec.load())
        except KernelUnavailable as exc:
            value = exc
        except ImportError as exc:  # a missing package is the common case; say which
            value = KernelUnavailable(f"import failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. an nvcc build at import: the kernel's failure, not the run's
            text = " ".join(str(exc).split())
            text = text if len(text) <= 300 else text[:300] + "..."
            value = KernelUnavailable(f"loading failed{_with_version(spec.source)}: {type(exc).__name__}: {text}")
        _LOADED[key] = (spec.load, value)
    value = _LOADED[key][1]
    if isinstance(value, KernelUnavailable):
        raise value
    return value


def kernel_device(args: Sequence, kwargs: dict) -> torch.device | None:
    """The CUDA device of the first CUDA tensor among a call's arguments; None when there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return None


class OnDevice:
    """A kernel made to run on its inputs' CUDA device and to finish there before it returns (`on_device`).

    A class rather than a closure so that it pickles whenever the kernel does (a worker process can
    be handed it by value).
    """

    harness_on_device = True

    def __init__(self, fn: Callable):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        device = kernel_device(args, kwargs)
        if device is None:
            return self.fn(*args, **kwargs)
        with torch.cuda.device(device):
            out = self.fn(*args, **kwargs)
            torch.cuda.synchronize(device)
        return out

    def __repr__(self) -> str:
        return f"on_device({self.fn!r})"


def on_device(fn: Callable) -> Callable:
    """``fn`` made to run on its inputs' CUDA device and to finish there before it returns.

    For a call with CUDA tensors: the tensors' device is made current (``torch.cuda.device``) for the
    call, because Triton launches on the *current* device and a worker thread's is ``cuda:0``
    whatever the inputs say; and ``torch.cuda.synchronize(device)`` runs before returning, so that a
    kernel that hangs does so inside the caller's timeout, an asynchronous error (an illegal address)
    is raised by this call and not by a later one, and the caller's clock measures the kernel rather
    than its launch. Without CUDA tensors it is a plain call. Wrapping twice wraps once.
    """
    if getattr(fn, "harness_on_device", False):
        return fn
    return OnDevice(fn)


def require_module(module: str, *, package: str | None = None):
    """Import ``module`` or raise `KernelUnavailable` naming the pip package to install, or, when the
    package is there, the dependency it lacks or the module its version does not have."""
    import importlib
    import importlib.util
    from pathlib import Path

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module.split(".")[0]
        top, missing = module.split(".")[0], getattr(exc, "name", None) or ""
        home = importlib.util.find_spec(top) if missing else None
        own = [Path(d) / missing.split(".")[0] for d in (home.submodule_search_locations or ())] if home else []
        if missing and missing != top and any(p.is_dir() or p.with_suffix(".py").is_file() for p in own):
            raise KernelUnavailable(  # mambapy 0.1.0's `from pscan import pscan` inside mambapy/mamba.py
                f"{package_version(pkg) or repr(pkg)} does not import: {module} imports its own module {missing!r} "
                f"as a top-level one ({exc}), which works only from inside its folder: a packaging bug of this "
                "version; install another") from None
        if missing and missing != top and not missing.startswith(top + "."):
            raise KernelUnavailable(  # the package is there; something it imports is not
                f"{package_version(pkg) or repr(pkg)} does not import: {module} needs {missing!r}, which is not "
                f"installed ({exc}); `pip install {missing.split('.')[0]}`") from None
        if missing.startswith(top + ".") and importlib.util.find_spec(top) is not None:
            raise KernelUnavailable(f"{package_version(pkg) or repr(pkg)} has no module {missing!r} ({exc}): another "
                                    "version than the adapter's") from None
        raise KernelUnavailable(f"package {pkg!r} is not installed ({exc}); `pip install {pkg}`") from None


def import_skipping_init(module: str, *, path: Sequence[str] | None = None, stand_ins: Sequence[str] = ()):
    """Import ``module`` (``pkg.sub.mod``) from ``pkg`` on ``sys.path`` (or ``path``) without running
    ``pkg/__init__.py``.

    For a package whose ``__init__`` imports what cannot load here (mamba-ssm's imports its CUDA
    extension and its model classes) while the submodule wanted needs none of it (its Triton kernels).
    The package is entered through its path: a bare module object with the package's ``__path__``
    stands in for it while ``module`` imports, and ``stand_ins`` names modules that are not there at
    all (an extension never built), each replaced by a module that raises on any attribute. Afterwards
    every module this import added under the package's name (and the stand-ins) is taken out of
    ``sys.modules`` again, so that a later plain ``import pkg`` is not answered by the stand-in; the
    returned module keeps its globals. Nothing installed is modified. Raises ImportError.
    """
    import importlib
    import importlib.machinery
    import sys
    import types

    top = module.partition(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, None if path is None else list(path))
    if found is None or not found.submodule_search_locations:
        raise ImportError(f"no package {top!r} on {'sys.path' if path is None else list(path)}", name=top)

    class _Absent(types.ModuleType):
        def __getattr__(self, attr: str):
            raise ImportError(f"{self.__name__} is not available here (imported by {module} without it)")

    package = types.ModuleType(top)
    package.__path__ = list(found.submodule_search_locations)
    package.__file__ = found.origin
    before = {name: sys.modules[name] for name in (top, *stand_ins) if name in sys.modules}
    added_before = set(sys.modules)
    sys.modules[top] = package
    sys.modules.update({name: _Absent(name) for name in stand_ins})
    try:
        return importlib.import_module(module)
    finally:
        for name in set(sys.modules) - added_before:
            if name.partition(".")[0] in (top, *stand_ins):
                del sys.modules[name]
        for name in (top, *stand_ins):
            sys.modules.pop(name, None)
        sys.modules.update(before)


def require_cuda() -> None:
    """Raise `KernelUnavailable` when no CUDA device is present."""
    if not torch.cuda.is_available():
        raise KernelUnavailable("needs a CUDA device; none is present on this machine")


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))
