"""A small cache of a problem's inputs, float64 oracle and same-dtype baseline, shared by the cases of one run.

`harness.runner.run_case` recomputes all three for every (kernel, problem). Kernels of one family, TF32
on and off, and chunk sizes see the same rounded inputs (`Problem.make_inputs` depends on none of them),
so a run that drives many kernels over one grid (the GPU sweep, the calibration) passes an `OracleCache`
in `harness.runner.RunOptions.oracle_cache` and computes each once. The inputs are handed out as copies:
a kernel that writes into its inputs (reported as such) cannot change the next kernel's. The oracle is
keyed on the problem without ``tf32`` and ``device`` (it always runs on the CPU in float64; ``chunk_size``
stays in the key only where the family's bound has a term for the chunk form, `FamilyDef.chunk_term`),
the baseline without ``tf32`` and ``chunk_size`` (it runs outside the TF32 block of `run_case` and takes
no chunk), both on the retention convention. Entries are dropped least recently used first beyond ``max_entries``,
or beyond ``max_bytes`` of tensors in one of the three caches (the newest entry always stays): a nightly problem
at L = 32,768 holds hundreds of MB of inputs and a trace of five output-sized float64 fields, and eight of them
kept beside a run's workers were what the out-of-memory killer found (session 12: a gated calibration killed at
11 GB resident).

The runner consults the cache only for inputs it made itself from the problem; inputs passed in (the
float64 re-run of a low-precision case) are never looked up.
"""

from __future__ import annotations

import collections
from typing import Any, Callable


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (dicts, lists, tuples and dataclasses such as a trace walked;
    a storage shared by several views counted once)."""
    import dataclasses

    import torch

    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
    return total


class OracleCache:
    """LRU caches of `Problem.make_inputs`, `harness.runner.reference_traces` and `baseline_outputs`;
    ``stats`` counts the hits and misses of the oracle and the baseline, ``input_stats`` those of the inputs."""

    def __init__(self, max_entries: int = 8, max_bytes: int = 1 << 30):
        from harness.errors import InvalidArgument

        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InvalidArgument(f"max_entries={max_entries!r} must be a whole number >= 1")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgument(f"max_bytes={max_bytes!r} must be a whole number of bytes >= 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sizes: dict[int, dict[Any, int]] = {}  # per cache (by id): each entry's bytes
        self.stats = {"hits": 0, "misses": 0}
        self.input_stats = {"hits": 0, "misses": 0}
        self._inputs: collections.OrderedDict = collections.OrderedDict()
        self._traces: collections.OrderedDict = collections.OrderedDict()
        self._baselines: collections.OrderedDict = collections.OrderedDict()

    def _get(self, cache: collections.OrderedDict, key: Any, compute: Callable[[], Any],
             stats: dict[str, int] | None = None) -> Any:
        stats = self.stats if stats is None else stats
        if key in cache:
            cache.move_to_end(key)
            stats["hits"] += 1
            return cache[key]
        stats["misses"] += 1
        value = cache[key] = compute()
        sizes = self._sizes.setdefault(id(cache), {})
        sizes[key] = tensor_bytes(value)
        while len(cache) > 1 and (len(cache) > self.max_entries or sum(sizes.values()) > self.max_bytes):
            old, _ = cache.popitem(last=False)
            sizes.pop(old, None)
        return value

    def held_bytes(self) -> int:
        """The bytes of tensors the three caches hold."""
        return sum(sum(sizes.values()) for sizes in self._sizes.values())

    def inputs(self, problem):
        """`Problem.make_inputs`, drawn once per problem up to tf32 and chunk size; a fresh copy each call."""
        key = problem.replace(tf32=False, chunk_size=None).key  # the device is part of it
        drawn = self._get(self._inputs, key, problem.make_inputs, self.input_stats)
        return {name: t.clone() for name, t in drawn.items()}

    def traces(self, problem, inputs, convention):
        """`harness.runner.reference_traces`, computed once per problem up to tf32 and device."""
        from harness import runner

        unchunked = {} if problem.definition.chunk_term else {"chunk_size": None}  # no chunk term: same bound
        key = (problem.replace(tf32=False, device="cpu", **unchunked).key, convention)
        return self._get(self._traces, key, lambda: runner.reference_traces(problem, inputs, convention))

    def baselines(self, problem, inputs, convention):
        """`harness.runner.baseline_outputs`, computed once per problem (and device) up to tf32 and chunk size."""
        from harness import runner

        key = (problem.replace(tf32=False, chunk_size=None).key, problem.device, convention)
        return self._get(self._baselines, key, lambda: runner.baseline_outputs(problem, inputs, convention))
