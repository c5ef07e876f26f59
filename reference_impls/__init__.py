"""Float64 CPU oracles: the sequential definitions every kernel is measured against.

Simple loops over the sequence, float64, checked against exact arithmetic in the tests
(``tests/test_oracle_exact.py``). No dependency on `harness`.

- `linear_recurrence` / `linear_recurrence_trace`: ``h_t = a_t h_{t-1} + b_t`` (family ``linear_scan``).
- `selective_scan` / `selective_scan_trace`: Mamba's selective scan, mamba-ssm layout.
- `retention`, `group_norm`, `retention_normed` and their ``*_trace``: RetNet's recurrent retention.
- `simple_gla`, `gla`, `ssd` and their ``*_trace``: the gated-decay recurrences (fla's simple GLA and
  GLA, Mamba-2's SSD), with initial/final states, variable-length batches and a `GatedTrace`.
- `Trace`: what an oracle saw (output, magnitude, growth, state_peak, decay_peak).

Each oracle takes ``compute_dtype=`` and ``device=``: with float64 on CPU (the default) it is the
oracle; with a kernel's dtype it is the same-dtype sequential baseline, the same code with every
operation rounded in that dtype. The shared loop and its order of arithmetic live in `_loop`, the
argument checks in `_validate`.
"""

from reference_impls.gated_decay import GatedTrace, gla, gla_trace, simple_gla, simple_gla_trace, ssd, ssd_trace
from reference_impls.linear_recurrence import linear_recurrence, linear_recurrence_trace
from reference_impls.retention import (
    default_gammas,
    group_norm,
    retention,
    retention_normed,
    retention_normed_trace,
    retention_trace,
)
from reference_impls.selective_scan import selective_scan, selective_scan_trace
from reference_impls.trace import Trace

__all__ = [
    "GatedTrace",
    "Trace",
    "default_gammas",
    "gla",
    "gla_trace",
    "group_norm",
    "linear_recurrence",
    "linear_recurrence_trace",
    "retention",
    "retention_normed",
    "retention_normed_trace",
    "retention_trace",
    "selective_scan",
    "selective_scan_trace",
    "simple_gla",
    "simple_gla_trace",
    "ssd",
    "ssd_trace",
]
