"""Root conftest: registers the hypothesis profiles (dev, ci, nightly) and loads ``ci`` by default.

``--hypothesis-profile NAME`` (hypothesis's own pytest option) or ``HYPOTHESIS_PROFILE`` picks another;
hypothesis shows the active profile in the pytest header.
"""

import os

import pytest
from hypothesis import settings

from harness.kernels.isolation import configure as configure_isolation
from harness.kernels.triton_interpreter import interpret_if_no_gpu
from harness.settings import DEFAULT_PROFILE, register_profiles

interpret_if_no_gpu()  # before any test imports triton (see harness/kernels/triton_interpreter.py)

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", DEFAULT_PROFILE))

# The suite runs its kernels (the harness's own and pinned third-party ones) in-process: on 2 busy
# cores a worker process per kernel made `make test` take 381 s of pytest time instead of 208 s
# (docs/isolation.md). The CLI and the plugin elsewhere default to worker
# processes; the tests of isolation ask for it (RunOptions(isolation="process")), and
# HARNESS_ISOLATION=process runs the whole suite isolated.
configure_isolation(isolation=os.environ.get("HARNESS_ISOLATION", "in-process"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (it runs first otherwise)
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (`make test`), the tests that share a costly computation run
    on one worker, so that it is computed once: a module-scoped fixture a test module defines and asks
    for by name (the GPU dry run, the wrong kernel's `harness check` run, the seed sweeps), and the
    per-process caches of `check` runs that several tests read (`tests/test_planted_bugs.py`'s searches,
    `tests/test_broken_kernels.py`'s checks). With plain ``--dist load`` a module split across the workers
    ran such a computation on each of them. Without xdist the marks do nothing."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = sorted(
            name for name, defs in (info.name2fixturedefs.items() if info else ())
            if name in info.argnames and defs and defs[-1].scope == "module"
            and getattr(defs[-1], "baseid", "").split("::")[0] == item.nodeid.split("::")[0]
        )
        if item.path.name in _SHARED_CACHE_TESTS and item.originalname in _SHARED_CACHE_TESTS[item.path.name]:
            shared.append("cache")
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}:{'+'.join(shared)}"))


#: Tests (by file) that read a per-process cache of `check` runs filled by the first of them.
_SHARED_CACHE_TESTS = {
    "test_planted_bugs.py": {"test_check_finds_the_planted_bug", "test_shrinking_never_grows_a_case",
                             "test_a_failing_search_spends_no_case_on_hypothesis_s_explanation"},
    "test_broken_kernels.py": {"test_check_reports_a_broken_kernel", "test_check_message_names_the_contract_violation"},
}
