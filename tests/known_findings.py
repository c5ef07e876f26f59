"""Third-party kernels with a forward finding the harness reports (documented in docs/adapters.md), shared by the
suites that run those kernels: an xfail that is not strict, since whether the ci draws reach it depends on the
options the search turns on (the gradient suite meets them too: it takes the forward first, and a divergent
forward is its record)."""

FORWARD_FINDINGS = {
    "mamba_ssm.mamba_chunk_scan_combined.ieee": "mamba-ssm's Triton softplus is log(exp(dt) + 1), not log1p: "
    "float32 relative error up to 0.17 for negative dt (tests/test_adapters.py)",
    "mamba_ssm.selective_state_update": "the same softplus, in float32 with delta_softplus (tests/test_adapters.py)",
}
