"""Root conftest: registers the hypothesis profiles (dev, ci, nightly) and loads ``ci`` by default.

``--hypothesis-profile NAME`` (hypothesis's own pytest option) or ``HYPOTHESIS_PROFILE`` picks another;
hypothesis shows the active profile in the pytest header.
"""

import os

from hypothesis import settings

from harness.kernels.triton_interpreter import interpret_if_no_gpu
from harness.settings import DEFAULT_PROFILE, register_profiles

interpret_if_no_gpu()  # before any test imports triton (see harness/kernels/triton_interpreter.py)

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", DEFAULT_PROFILE))
