"""A small cache of the float64 oracle and the same-dtype baseline, shared by the cases of one run.

`harness.runner.run_case` recomputes both for every (kernel, problem). Kernels of one family, TF32 on
and off, and chunk sizes see the same rounded inputs (`Problem.make_inputs` depends on none of them), so
a run that drives many kernels over one grid (the GPU sweep) passes an `OracleCache` in
`harness.runner.RunOptions.oracle_cache` and computes each once. The oracle is keyed on the problem
without ``tf32`` and ``device`` (it always runs on the CPU in float64; ``chunk_size`` stays in the key
because the gated families' bound has a term for the chunk form), the baseline without ``tf32`` and
``chunk_size`` (it runs outside the TF32 block of `run_case` and takes no chunk), both on the retention
convention. Entries are dropped least recently used first beyond ``max_entries``.

The runner consults the cache only for inputs it made itself from the problem; inputs passed in (the
float64 re-run of a low-precision case) are never looked up.
"""

from __future__ import annotations

import collections
from typing import Any, Callable


class OracleCache:
    """LRU caches of `harness.runner.reference_traces` and `baseline_outputs`; ``stats`` counts hits and misses."""

    def __init__(self, max_entries: int = 8):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            from harness.errors import InvalidArgument

            raise InvalidArgument(f"max_entries={max_entries!r} must be a whole number >= 1")
        self.max_entries = max_entries
        self.stats = {"hits": 0, "misses": 0}
        self._traces: collections.OrderedDict = collections.OrderedDict()
        self._baselines: collections.OrderedDict = collections.OrderedDict()

    def _get(self, cache: collections.OrderedDict, key: Any, compute: Callable[[], Any]) -> Any:
        if key in cache:
            cache.move_to_end(key)
            self.stats["hits"] += 1
            return cache[key]
        self.stats["misses"] += 1
        value = cache[key] = compute()
        if len(cache) > self.max_entries:
            cache.popitem(last=False)
        return value

    def traces(self, problem, inputs, convention):
        """`harness.runner.reference_traces`, computed once per problem up to tf32 and device."""
        from harness import runner

        key = (problem.replace(tf32=False, device="cpu").key, convention)
        return self._get(self._traces, key, lambda: runner.reference_traces(problem, inputs, convention))

    def baselines(self, problem, inputs, convention):
        """`harness.runner.baseline_outputs`, computed once per problem (and device) up to tf32 and chunk size."""
        from harness import runner

        key = (problem.replace(tf32=False, chunk_size=None).key, problem.device, convention)
        return self._get(self._baselines, key, lambda: runner.baseline_outputs(problem, inputs, convention))
