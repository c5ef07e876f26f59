"""Hypothesis settings profiles and the search limits that go with each.

Three profiles, selectable with ``--hypothesis-profile`` (or ``HYPOTHESIS_PROFILE``) and shown in the
pytest header by hypothesis itself:

- ``dev``: quick local runs, random, with the example database (so a failure replays first).
- ``ci``: derandomized (the same examples every run: a CI gate must not flake), without hypothesis's
  targeting (`CI_PHASES`: the draws must not follow the kernel's own errors, or a changed kernel is
  compared on other cases), bounded so that ``make test`` stays within its budget on 2 cores.
- ``nightly``: many more examples and lengths up to tens of thousands.

`Limits` holds what the strategies draw inside each profile (longest sequence, largest dims); the
examples per kernel are scaled by the kernel's cost class (the Triton interpreter is ~1000x slower).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("dev", "ci", "nightly")
DEFAULT_PROFILE = "ci"


@dataclass(frozen=True)
class Limits:
    max_length: int
    max_batch: int
    max_dim: int
    max_state: int
    max_heads: int
    max_head_dim: int
    max_examples: int
    slow_max_examples: int  # kernels run by an interpreter (Triton on the CPU)
    slow_max_length: int
    #: Head dims and state sizes drawn now and then beyond the ranges above: one past a tile of 16, 32, 64
    #: (a kernel that tiles them and drops or misreads the last partial tile differs only there).
    tile_edges: tuple[int, ...] = ()
    #: Seconds per kernel call before it is a ``timeout`` kernel_error, unless the session says otherwise
    #: (``--timeout``, ``[tool.harness] timeout``, `isolation.configure`). The timeout is for hangs: a correct
    #: kernel that runs out of it is a false alarm. nightly's longest cases take a correct kernel over 120 s
    #: on a CPU (bfloat16 retention, L = 32,768, head dim 65: docs/calibration.md, session 9).
    timeout_s: float = 120.0

    @property
    def largest_state_elements(self) -> int:
        """The most elements one batch row and head's state can have in this profile: both of its sizes (dk x
        dv; SSD's headdim x N) at most the largest head dim, state size or tile edge drawn."""
        return max(self.max_head_dim, self.max_state, *self.tile_edges) ** 2


LIMITS: dict[str, Limits] = {
    "dev": Limits(512, 2, 8, 8, 3, 16, 20, 4, 32),
    # 4 heads: the fewest with 2 B/C groups of 2 heads each, which tell head h -> group h // (H/G) from h % G
    "ci": Limits(2048, 2, 8, 8, 4, 16, 25, 5, 48, tile_edges=(17, 33)),
    "nightly": Limits(32768, 3, 32, 16, 4, 64, 400, 40, 256, tile_edges=(17, 33, 65), timeout_s=900.0),
}

_COMMON = dict(
    deadline=None,  # kernel time varies with the drawn length; the harness has its own per-call timeout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)


#: ``ci``'s phases: no ``target``. Hypothesis's targeting steers the second half of a search's draws toward the
#: cases where the kernel's own cond error was largest (`harness.api.check` reports it), so two correct
#: versions of one kernel drew different cases: 15 of 25 in common, and the gate compared cells of different
#: cases (a blind hunt's correct change failed it, session 24). Without it the draws are a function of the
#: kernel's name, family and dtype alone, until a failure is shrunk (`check` then makes no ``target()`` call
#: either: hypothesis's generation follows the observations even without the phase, 19 of 25 in common).
#: Every planted bug is found within its first 9 cases, before targeting would start (docs/detection.md);
#: nightly keeps it.
CI_PHASES = tuple(phase for phase in Phase if phase is not Phase.target)


def register_profiles() -> None:
    """Register ``dev``, ``ci`` and ``nightly`` with hypothesis (idempotent)."""
    settings.register_profile("dev", max_examples=LIMITS["dev"].max_examples, **_COMMON)
    settings.register_profile("ci", max_examples=LIMITS["ci"].max_examples, derandomize=True, database=None,
                              phases=CI_PHASES, **_COMMON)
    settings.register_profile("nightly", max_examples=LIMITS["nightly"].max_examples,
                              phases=list(Phase), **_COMMON)


def active_profile() -> str:
    """The name of the loaded hypothesis profile when it is one of ours, else the default."""
    name = getattr(settings, "_current_profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or DEFAULT_PROFILE
    return name if name in LIMITS else DEFAULT_PROFILE


def limits(profile: str | None = None) -> Limits:
    return LIMITS[profile or active_profile()]


@contextlib.contextmanager
def without_local_constants() -> Iterator[None]:
    """Hypothesis's draws inside the block do not use the constants of the caller's own code.

    Hypothesis reads the literals of every module it takes for local (outside site-packages: the kernel
    author's files, the harness itself when installed editable) and now and then draws one of them. A
    check's draws then moved with code it does not run: an unused ``THRESHOLD = 100`` added to the kernel's
    file changed 17 of 25 float16 cases at ci, and the gate compared other cells (a blind hunt, session 24);
    an editable install and a wheel drew differently. The draws stay a function of the seed alone. Where
    hypothesis has no such pool (an older or newer version), nothing is changed."""
    try:
        from hypothesis.internal.conjecture import providers
        empty, cache, original = providers.Constants(), providers.CONSTANTS_CACHE, providers._get_local_constants
    except (ImportError, AttributeError):
        yield
        return
    cache.cache.clear()  # the permitted values of each kind are cached with the local pool in them
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()


@contextlib.contextmanager
def without_seed_advice() -> Iterator[None]:
    """Hypothesis's advice to add ``@seed(N)`` "to this test" is not printed inside the block.

    A check's search is not the user's test: a `harness check` stopped by SIGTERM printed "You can reproduce
    this failure by adding @seed(...) to this test." above its own line, for a run that had not failed and a
    test the user never wrote. Every case carries its own seed and replay command instead. Anything else
    hypothesis reports is passed on."""
    from hypothesis.reporting import current_reporter, with_reporter

    outer = current_reporter()

    def report(value: object) -> None:
        if not (isinstance(value, str) and "@seed(" in value):
            outer(value)

    with with_reporter(report):
        yield
