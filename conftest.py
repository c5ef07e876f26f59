"""Root conftest: registers the hypothesis profiles (dev, ci, nightly) and loads ``ci`` by default.

``--hypothesis-profile NAME`` (hypothesis's own pytest option) or ``HYPOTHESIS_PROFILE`` picks another;
hypothesis shows the active profile in the pytest header.
"""

import os

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
