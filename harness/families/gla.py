"""``gla``: `simple_gla` with a log-decay per key channel, g (batch, T, heads, K):
``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`` (fla's layout; `reference_impls.gated_decay.gla`)."""

from __future__ import annotations

from harness.families.simple_gla import SimpleGLA
from harness.kernels.contract import Family


class GLA(SimpleGLA):
    family = Family.GLA
    per_key = True


FAMILY = GLA()
