"""Running one case, and a list of cases, end to end.

One case: `Problem.make_inputs` -> the float64 oracle's `Trace` -> the kernel, called under its contract
(`harness.kernels.guard`) -> the same-dtype sequential baseline -> `metrics.measure` -> `verdict.judge`
-> one flat record (a dict), appended to the store when one is given. Nothing the kernel does makes
`run_case` raise: a kernel failure becomes a ``kernel_error`` record and the run goes on.

``cause`` answers the question the seed threads asked, in one word: ``rounding`` (equivalent),
``kernel_bug`` (divergent), ``eps_effect`` (divergent through the norm's eps only: the same case at
eps = 0 is equivalent), ``precision_loss`` (divergent in a low precision, equivalent on the same inputs
in float64: the algorithm is right and loses digits a plain loop in that dtype keeps), ``tf32``
(divergent in float32, equivalent when the kernel's Triton dots run in IEEE float32 instead of TF32),
``chunk_rounding`` (divergent: a kernel that declares no chunk size, beyond the bound of every assumed chunk size
(`_judged_at_assumed_chunk`) and within that of decays formed over the whole sequence),
``input_overflow`` (out_of_domain: the inputs overflow the dtype), ``near_overflow`` (out_of_domain: exact
values in range, within their error bound of the dtype's max), ``precision_exhausted``
(out_of_domain: no digit of the output is guaranteed in the dtype), or the contract outcome of a kernel
error.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import torch

from harness import dtypes, families
from harness.errors import InvalidArgument
from harness.kernels.contract import DTYPE_NAMES, RETNET, Family, KernelSpec, RetentionConvention
from harness.kernels import isolation
from harness.kernels.guard import Outcome, call_guarded, shape_hint
from harness.problems import Problem
from harness.verdict import Judgement, Policy, Verdict, domain_kind, judge

#: Order of the tensor arguments of each family's call (each family's ``arg_order``).
ARG_ORDER: dict[Family, tuple[str, ...]] = {Family.parse(n): families.get(n).arg_order for n in families.MODULES}


def output_shape(problem: Problem) -> tuple[int, ...]:
    """The shape the family's contract promises for ``problem``."""
    return problem.definition.output_shape(problem)


def named_inputs(problem: Problem, message: str | None) -> str | None:
    """``message`` with the guard's "input #3" (a positional argument, counted from 0) named as the family
    calls it, "input 'g'": a blind hunt (session 28) had to count the call's arguments to know which was written."""
    if not message:
        return None
    names = problem.positional_names()

    def named(match: re.Match) -> str:
        i = int(match.group(1))
        return f"input {names[i]!r}" if i < len(names) and names[i] else match.group(0)

    return re.sub(r"input #(\d+)", named, message)


def call_args(problem: Problem, inputs: dict[str, torch.Tensor],
              spec: KernelSpec | None = None) -> tuple[tuple, dict[str, Any]]:
    """The positional and keyword arguments of the family's signature for ``inputs``.

    ``chunk_size`` is passed only to kernels that take one (a pair of forms shares one problem).
    """
    kwargs = problem.call_kwargs()
    if spec is not None and not spec.capabilities.takes_chunk:
        kwargs.pop("chunk_size", None)
    return problem.definition.call_args(problem, inputs, kwargs)


def reference_trace(problem: Problem, inputs: dict[str, torch.Tensor],
                    convention: RetentionConvention = RETNET):
    """The float64 oracle's `Trace` on the (already rounded) ``inputs``."""
    x = {k: v.detach().to(device="cpu", dtype=torch.float64) for k, v in inputs.items()}
    return problem.definition.trace(problem, x, convention)


def reference_traces(problem: Problem, inputs: dict[str, torch.Tensor],
                     convention: RetentionConvention = RETNET) -> dict[str, Any]:
    """The float64 oracle's `Trace` of each measured target (``"output"``, and ``"final_state"`` where the
    problem asks for it) on the (already rounded) ``inputs``."""
    x = {k: v.detach().to(device="cpu", dtype=torch.float64) for k, v in inputs.items()}
    return problem.definition.traces(problem, x, convention)


def chunk_blocking(spec: KernelSpec, problem: Problem) -> Problem:
    """``problem`` with the chunk its kernel's chunk term is charged on: the whole sequence for a kernel whose
    cumulative decay sums span it (`Capabilities.decays_across_chunks`), whether or not it takes a chunk size (a
    parallel form with one cumulative sum over the sequence takes none; its declaration was ignored, a blind
    hunt found, session 23), else its own chunk."""
    if problem.definition.chunk_term and spec.capabilities.decays_across_chunks:
        return problem.replace(chunk_size=max(1, problem.length))
    return problem


def chunk_term_at(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor],
                  traces_of: Callable[..., dict[str, Any]] = reference_traces) -> dict[str, Any]:
    """The oracle's traces of ``problem`` for ``spec``: its chunk term charged at the rounding of the dtype the
    kernel forms its chunk decays in (`Capabilities.chunk_precision`) when that is finer than the case's, and
    over the whole sequence for a kernel whose decays span it (`Capabilities.decays_across_chunks`).

    The traces carry their chunk term apart (`Trace.chunk_growth`), so it is scaled by
    ``u(chunk dtype) / u(precision)`` without another oracle run; ``traces_of`` is the run's oracle cache where
    there is one."""
    caps = spec.capabilities
    problem = chunk_blocking(spec, problem)
    traces = traces_of(problem, inputs, spec.convention)
    if problem.chunk_size is None or not problem.definition.chunk_term:
        return traces
    scale = dtypes.unit_roundoff(caps.chunk_precision(problem.dtype)) / dtypes.unit_roundoff(caps.precision(problem.dtype))
    if not scale < 1.0:
        return traces
    return {name: trace if trace.chunk_growth is None else
            replace(trace, growth=trace.growth - (1.0 - scale) * trace.chunk_growth) for name, trace in traces.items()}


def baseline_output(problem: Problem, inputs: dict[str, torch.Tensor],
                    convention: RetentionConvention = RETNET) -> torch.Tensor | None:
    """The plain sequential loop in the kernel's dtype (None for float64, where it is the oracle)."""
    found = baseline_outputs(problem, inputs, convention)
    return None if found is None else found["output"]


def baseline_outputs(problem: Problem, inputs: dict[str, torch.Tensor],
                     convention: RetentionConvention = RETNET) -> dict[str, torch.Tensor | None] | None:
    """The plain sequential loop's targets in the kernel's dtype (None for float64: it is the oracle)."""
    if problem.dtype == "float64":
        return None
    from harness.kernels.sequential import baseline_for

    fn = baseline_for(problem.family).callable()
    args, kwargs = call_args(problem, inputs)
    kwargs.pop("chunk_size", None)
    kwargs.update(problem.definition.baseline_kwargs(problem, convention))
    with torch.no_grad():
        return problem.definition.split_output(problem, fn(*args, **kwargs))


@contextlib.contextmanager
def tf32_mode(enabled: bool):
    """TF32 on or off for float32 matmuls on CUDA (`harness.gpu.tf32_settings`); a no-op without CUDA."""
    if not torch.cuda.is_available():
        yield
        return
    from harness.gpu import tf32_settings

    with tf32_settings(enabled):
        yield


@dataclass
class RunOptions:
    """How cases are run: the verdict policy, the per-call timeout, where the kernel runs, optional checks.

    ``timeout_s`` and ``isolation`` default to the session's (`harness.kernels.isolation.configure`:
    ``--timeout``, ``--in-process``); ``isolation`` is ``"process"`` (a worker process per kernel) or
    ``"in-process"`` (for pdb).
    """

    policy: Policy = field(default_factory=Policy)
    timeout_s: float | None = field(default_factory=isolation.default_timeout)
    check_determinism: bool = False
    eps_counterfactual: bool = True  # re-run a divergent normed case at eps = 0 to name an eps effect
    # re-run a divergent low-precision case on the same (rounded) inputs in float64 to name precision loss
    precision_counterfactual: bool = True
    # re-run a divergent case with the later inputs changed to tell a future leak (`_future_leak`)
    future_leak_probe: bool = True
    # re-call a divergent float32 kernel with IEEE float32 Triton dots to name TF32 (`_ieee_dots`)
    tf32_counterfactual: bool = True
    # judge an undeclared kernel's divergent gated/selective case at assumed chunk sizes (`_judged_at_assumed_chunk`)
    chunk_counterfactual: bool = True
    # judge a divergent output against the oracle's times the best constant, to name a scale (`_constant_factor`)
    factor_counterfactual: bool = True
    # judge a divergent output against the oracle's on the inputs with two axes swapped (`_swapped_layout`)
    layout_counterfactual: bool = True
    # judge a divergent output against the oracle's with an optional term or the softplus left out (`_named_slip`)
    slip_counterfactual: bool = True
    isolation: str = field(default_factory=isolation.default_isolation)
    oracle_cache: Any = None  # a harness.oracle_cache.OracleCache shared by the run's cases, or None

    def worker_for(self, spec: KernelSpec, kernel_fn: Callable | None = None) -> tuple[Any, str]:
        """(the worker reference ``spec`` runs under, or None for in-process; the record's ``isolation``)."""
        if self.isolation == "in-process":
            return None, "in-process"
        ref, why = isolation.kernel_ref(spec, kernel_fn)
        return (ref, "process") if ref is not None else (None, f"in-process: {why}")


def replay_command(kernel: "str | KernelSpec", problem: Problem) -> str:
    """The shell command that re-runs exactly this case (a user kernel by its target, every part quoted)."""
    import json
    import shlex

    return (f"harness replay --kernel {shlex.quote(_replay_name(kernel))} "
            f"--problem {shlex.quote(json.dumps(problem.to_dict(), sort_keys=True))}")


def pair_replay_command(spec_a: "str | KernelSpec", spec_b: "str | KernelSpec", problem: Problem) -> str:
    """The shell command that re-runs a differential sweep's pair on this case (`run_pair`): A's replay command
    with ``--against B``. A pair row replayed A alone against the oracle, never the pair's difference."""
    import shlex

    return f"{replay_command(spec_a, problem)} --against {shlex.quote(_replay_name(spec_b))}"


def _replay_name(kernel: "str | KernelSpec") -> str:
    """How a replay command names ``kernel``: a user kernel by its target, a registered one by its name."""
    return kernel if isinstance(kernel, str) else (isolation.user_target(kernel) or kernel.name)


def _spec_for(spec: "KernelSpec | str", problem: Problem) -> KernelSpec:
    """``spec`` (a registered name is looked up), refused with `InvalidArgument` when it is not one of
    ``problem``'s family: its call would be handed another family's inputs."""
    from harness.kernels.registry import get

    if isinstance(spec, str):
        spec = get(spec)
    if not isinstance(spec, KernelSpec):
        raise InvalidArgument(f"spec={spec!r} is a {type(spec).__name__}; expected a KernelSpec or a registered "
                              f"kernel's name (harness.api.user_kernel_spec makes one of a function)")
    if not isinstance(problem, Problem):
        raise InvalidArgument(f"problem={problem!r} is a {type(problem).__name__}; expected a harness.Problem")
    if spec.family is not problem.family:
        raise InvalidArgument(f"kernel {spec.name!r} is a {spec.family.value} kernel; problem.family="
                              f"{problem.family.value!r}: give it a {spec.family.value} problem")
    return spec


def run_case(spec: "KernelSpec | str", problem: Problem, options: RunOptions | None = None, *,
             kernel_fn: Callable | None = None, store=None,
             keep_output: dict[str, torch.Tensor] | None = None,
             inputs: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Run ``spec`` (a `KernelSpec` or a registered kernel's name; or ``kernel_fn`` in its place) on ``problem``;
    return the flat record. A kernel of another family than the problem's is an `InvalidArgument`.

    ``keep_output``: a dict that receives the kernel's output under ``"output"`` (differential mode).
    ``inputs``: the tensors to use instead of ``problem.make_inputs()`` (in ``problem``'s dtype; the
    float64 re-run of a low-precision case passes that case's rounded inputs, upcast exactly).
    """
    spec = _spec_for(spec, problem)
    options = options or RunOptions()
    timings: dict[str, float] = {}
    began = t0 = time.perf_counter()
    cache = options.oracle_cache if inputs is None else None  # inputs passed in are not the problem's own
    if inputs is None:
        inputs = cache.inputs(problem) if cache is not None else problem.make_inputs()
    timings["t_inputs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # a stop asked for while this process computes (the oracle, the loop, the measurement: seconds each at
    # nightly lengths) is taken between those steps, not only at the next kernel wait (docs/isolation.md)
    isolation.raise_if_stopped()
    traces = chunk_term_at(spec, problem, inputs, (cache.traces if cache is not None else reference_traces))
    trace = traces["output"]
    timings["t_oracle"] = time.perf_counter() - t0

    record: dict[str, Any] = {"kernel": spec.name, "family": problem.family.value, "case": problem.key}
    record.update(problem.to_dict())
    record.pop("values", None)
    record["explicit_values"] = problem.values is not None
    record["replay"] = replay_command(spec, problem)

    worker, record["isolation"] = options.worker_for(spec, kernel_fn)
    isolation.raise_if_stopped()  # an in-process call without a timeout has no wait that would take it
    result = _call_kernel(spec, problem, inputs, options, kernel_fn, worker, options.check_determinism)
    timings["t_kernel"] = result.seconds
    if keep_output is not None and result.output is not None:
        keep_output["output"] = result.output.detach().to("cpu", torch.float64)
    record["outcome"] = result.outcome.value
    record["error"] = named_inputs(problem, result.message) if result.outcome is Outcome.MUTATED_INPUT \
        else result.message or None
    if result.note:
        record["isolation_note"] = result.note

    if not result.ok:
        judgement = judge({}, options.policy, kernel_error=f"{result.outcome.value}: {record['error']}")
        timings["t_case"] = time.perf_counter() - began
        _finish(record, judgement, cause=result.outcome.value, timings=timings)
        if store is not None:
            store.append(record)
        return record

    outputs = problem.definition.split_output(problem, (result.output, *result.extras))
    precision = spec.capabilities.precision(problem.dtype)
    record["precision"] = precision
    if problem.chunk_size is not None and problem.definition.chunk_term:
        chunk_precision = spec.capabilities.chunk_precision(problem.dtype)
        if chunk_precision != precision:  # declared: the chunk term was charged at its rounding (`chunk_term_at`)
            record["chunk_precision"] = chunk_precision
    storage = dtypes.dtype_key(dtypes.torch_dtype(precision))  # a declared "tf32"/"tf32_rz" is float32 storage
    t0 = time.perf_counter()
    isolation.raise_if_stopped()
    try:
        baselines = (cache.baselines if cache is not None else baseline_outputs)(
            problem.replace(dtype=storage), {k: v.to(DTYPE_NAMES[storage]) for k, v in inputs.items()}, spec.convention)
    except Exception as exc:  # noqa: BLE001 - a baseline failure must not lose the kernel's measurement
        baselines, record["baseline_error"] = None, f"{type(exc).__name__}: {exc}"
    timings["t_baseline"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    isolation.raise_if_stopped()
    # the oracle's traces at the chunk sizes a kernel that declares none may run (`_AssumedChunks`); one step has
    # no cumulative sum to round (a half-only bug of a step loop, shrunk to L = 1, was told to declare a chunk size)
    chunked = _AssumedChunks(spec, problem, inputs) if assumes_chunk(spec, problem, options) else None
    div, judgement = _judge_outputs(problem, outputs, traces, baselines, precision, options, record)
    wide_run: dict[str, Any] = {}  # the float64 run that confirms an assumed chunk in half precision, if made
    if judgement.verdict is Verdict.DIVERGENT and chunked is not None:
        confirm = None
        if precision in CONFIRMED_IN_FLOAT64:
            def confirm() -> dict[str, Any] | None:
                if not runs_float64(spec, problem, options):
                    return None
                wide_run.update(_rerun_in("float64", spec, problem, inputs, replace(rerun_options(options),
                                                                                    chunk_counterfactual=True),
                                          kernel_fn))
                return wide_run

        div, judgement = _judged_at_assumed_chunk(chunked, div, judgement, outputs, baselines, precision, options,
                                                  record, confirm)
    record.update({k: v for k, v in div.to_dict().items() if k not in record})
    if judgement.rule == "kernel_nonfinite":  # which of the family's intermediates overflows on this case, if known
        hint = problem.definition.nonfinite_hint(problem, inputs, precision)
        if hint:
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {hint}", judgement.rule)
    timings["t_measure"] = time.perf_counter() - t0

    cause = {Verdict.EQUIVALENT: "rounding", Verdict.DIVERGENT: "kernel_bug",
             Verdict.OUT_OF_DOMAIN: domain_kind(div)}.get(judgement.verdict,
                                                           record.get("final_state_outcome", "kernel_error"))
    if (judgement.verdict is Verdict.DIVERGENT and options.eps_counterfactual
            and problem.definition.takes_eps and problem.eps):
        t0 = time.perf_counter()
        zero = run_case(spec, problem.replace(eps=0.0), rerun_options(options), kernel_fn=kernel_fn)
        timings["t_eps0"] = time.perf_counter() - t0
        record["eps0_cond_max"] = zero.get("cond_max")
        if zero["verdict"] == Verdict.EQUIVALENT.value:
            cause = "eps_effect"
            placement = (problem.definition.eps_placement(
                problem, {k: v.detach().to(device="cpu", dtype=torch.float64) for k, v in inputs.items()},
                outputs["output"], spec.convention) if outputs.get("output") is not None else None)
            judgement = Judgement(judgement.verdict, judgement.why + (
                f"; eps effect: the same case at eps=0 is equivalent (cond_max {zero.get('cond_max'):.3g})")
                + (f"; {placement}" if placement else ""))
    if (cause == "kernel_bug" and options.future_leak_probe and div.onset_t is not None
            and outputs.get("output") is not None):
        t0 = time.perf_counter()
        leak = _future_leak(spec, problem, inputs, outputs["output"], trace, div.onset_t, options, kernel_fn, worker)
        timings["t_leak"] = time.perf_counter() - t0
        if leak is not None:
            record["future_leak"] = True
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {leak}", judgement.rule)
    sequence = None
    if (options.chunk_counterfactual and problem.definition.chunk_term and problem.chunk_size is not None
            and not spec.capabilities.decays_across_chunks and problem.length > problem.chunk_size):
        # a kernel handed a chunk size that forms its decays over the whole sequence (the quadratic "dual" SSD form,
        # whose signature takes the family's chunk_size and ignores it) was judged at its chunk, with no advice
        sequence = _ChunkedTraces(spec, problem, inputs, chunk=problem.length)
    if (cause == "kernel_bug" and not record.get("future_leak") and options.tf32_counterfactual
            and precision == "float32" and not problem.tf32):
        t0 = time.perf_counter()
        found = _ieee_dots(spec, problem, inputs, result.output, traces, baselines, options, kernel_fn, worker, record,
                           chunked)
        timings["t_ieee_dots"] = time.perf_counter() - t0
        if found is not None:
            cause, judgement = "tf32", Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    other_run: dict[str, torch.Tensor] = {}  # the second-dtype run's output (`_undeclared_precision` reads it)
    if (cause == "kernel_bug" and not record.get("future_leak") and options.precision_counterfactual
            and spec.capabilities.runs("float64" if precision != "float64" else "float32", problem.device) is None):
        t0 = time.perf_counter()
        cause, judgement = _precision_counterfactual(spec, problem, inputs, options, kernel_fn, record, judgement,
                                                     precision, keep_output=other_run,
                                                     again=None if wide_run.get("assumed_chunk_size") else wide_run)
        timings["t_other_dtype"] = time.perf_counter() - t0
    if cause == "kernel_bug" and precision == "float64" and "output" in other_run:  # its float32 run, kept above
        t0 = time.perf_counter()
        named, found = _undeclared_precision(problem, outputs, traces, baselines, options, record,
                                             other_run["output"])
        timings["t_undeclared_precision"] = time.perf_counter() - t0
        if found is not None:
            cause = "undeclared_precision" if named else cause
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    if (cause in ("kernel_bug", "precision_loss") and precision in ("float64", "float32")
            and not record.get("future_leak") and options.precision_counterfactual):
        t0 = time.perf_counter()
        found = _half_precision_outputs(problem, outputs, traces, options, record, precision)
        hint = None if found is not None or cause != "kernel_bug" else _half_precision_hint(
            problem, outputs, traces, options, record)
        timings["t_half_precision"] = time.perf_counter() - t0
        if found is not None:
            cause, judgement = "undeclared_precision", Judgement(judgement.verdict, f"{judgement.why}; {found}",
                                                                 judgement.rule)
        elif hint is not None:
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {hint}", judgement.rule)
    whole = None if chunked is None or cause not in ("kernel_bug", "precision_loss") else chunked.whole_sequence()
    if whole is not None and not record.get("future_leak"):
        t0 = time.perf_counter()
        found = _sequence_bound(whole, outputs, baselines, precision, options, record)
        timings["t_chunked_bound"] = time.perf_counter() - t0
        if found is not None:  # the cause where nothing else named it; beside precision_loss, the advice
            cause = "chunk_rounding" if cause == "kernel_bug" else cause
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    if cause in ("kernel_bug", "precision_loss") and not record.get("future_leak") and sequence is not None:
        t0 = time.perf_counter()
        found = _sequence_bound(sequence, outputs, baselines, precision, options, record)
        timings["t_chunked_bound"] = time.perf_counter() - t0
        if found is not None:  # advice only: the chunk it was handed may be the one it uses, and the whole
            # sequence's bound is loose enough in half precision to hold a real slip of a chunk kernel
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    if cause in ("kernel_bug", "precision_loss") and not record.get("future_leak") and record.get("chunk_precision"):
        found = _declared_chunk_precision(spec, problem, inputs, outputs, baselines, precision, options, record)
        if found is not None:
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    handed_back = _returned_input(inputs, outputs) if cause == "kernel_bug" else None
    if handed_back is not None:  # no layout or factor explains an output that is an input as it was handed
        judgement = Judgement(judgement.verdict, f"{judgement.why}; {handed_back}", judgement.rule)
    if cause == "kernel_bug" and handed_back is None and not record.get("future_leak") and options.layout_counterfactual:
        t0 = time.perf_counter()
        found = _swapped_layout(problem, inputs, outputs, precision, options, record, spec.convention)
        timings["t_layout"] = time.perf_counter() - t0
        if found is not None:
            cause, judgement = "layout", Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    if cause == "kernel_bug" and handed_back is None and not record.get("future_leak") and options.factor_counterfactual:
        t0 = time.perf_counter()
        found = _constant_factor(problem, outputs, traces, baselines, precision, options, record, spec.convention)
        timings["t_constant_factor"] = time.perf_counter() - t0
        if found is not None:
            cause, judgement = "constant_factor", Judgement(judgement.verdict, f"{judgement.why}; {found}",
                                                            judgement.rule)
    if cause == "kernel_bug" and handed_back is None and not record.get("future_leak") and options.slip_counterfactual:
        t0 = time.perf_counter()
        found = _named_slip(problem, inputs, outputs, precision, options, record, spec.convention)
        timings["t_slip"] = time.perf_counter() - t0
        if found is not None:
            judgement = Judgement(judgement.verdict, f"{judgement.why}; {found}", judgement.rule)
    timings["t_case"] = time.perf_counter() - began
    _finish(record, judgement, cause=cause, timings=timings)
    if store is not None:
        store.append(record)
    return record


def _returned_input(inputs: dict[str, torch.Tensor], outputs: dict[str, Any]) -> str | None:
    """The why's clause for a divergent output that is one of the case's inputs bit for bit (a stub that returns
    ``b``), else None. A blind hunt's such kernel was shrunk to a case where reading the inputs with two axes
    swapped made the oracle's output equal ``b``, and the cause read ``layout``."""
    out = outputs.get("output")
    if not isinstance(out, torch.Tensor):
        return None
    from harness.kernels.isolation import same_bits

    for name, x in inputs.items():
        if isinstance(x, torch.Tensor) and x.shape == out.shape and same_bits(out.detach().to(x.device), x):
            return f"the output is input {name!r} as it was handed, bit for bit: the kernel returns its input"
    return None


def _call_kernel(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], options: RunOptions,
                 kernel_fn: Callable | None, worker: Any, check_determinism: bool, float32_dots: str | None = None):
    """One guarded call of the kernel on ``inputs`` (`harness.kernels.guard.call_guarded`)."""
    fn = kernel_fn if kernel_fn is not None else spec.callable()
    args, kwargs = call_args(problem, inputs, spec)
    with tf32_mode(problem.tf32), torch.no_grad():
        return call_guarded(fn, args, kwargs, expected_shape=output_shape(problem),
                            expected_dtype=problem.torch_dtype, expected_device=inputs[next(iter(inputs))].device,
                            timeout_s=options.timeout_s, check_determinism=check_determinism, worker=worker,
                            float32_dots=float32_dots)


def _ieee_dots(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], output: torch.Tensor,
               traces: dict[str, Any], baselines: dict[str, Any] | None, options: RunOptions,
               kernel_fn: Callable | None, worker: Any, record: dict[str, Any],
               chunked: "_AssumedChunks | None" = None) -> str | None:
    """Whether a divergent float32 case is TF32's doing: the why's clause if so, else None.

    Triton's float32 ``tl.dot`` runs in TF32 by default (the operands' low 13 fraction bits dropped; the
    corrected interpreter does the same, `harness.kernels.triton_interpreter`), so a float32 Triton kernel
    that names no ``input_precision`` errs about 8,192 times float32's rounding: not an algebraic mistake,
    and not what a float32 bound allows. The kernel is called once more, on copies of the same inputs,
    with IEEE float32 dots (`harness.kernels.isolation.float32_dots`); a kernel without Triton dots returns
    the same bits and nothing is said. Where the IEEE output (and final state) is equivalent, the case's
    error is TF32's: the record keeps its verdict (the kernel does err beyond float32's bound), with
    ``ieee_dots_cond_max``, and the cause becomes ``tf32``. For a kernel that declares no chunk size
    (``chunked``, `_AssumedChunks`) the IEEE output may instead be within the bound of a chunked form at an
    assumed chunk size: a Triton chunk kernel has both (fla's ``chunk_simple_gla`` named directly); the why then
    says both.
    """
    result = _call_kernel(spec, problem, {k: v.clone() for k, v in inputs.items()}, options, kernel_fn, worker,
                          False, float32_dots="ieee")
    if not result.ok or isolation.same_bits(result.output, output):
        return None
    outputs = problem.definition.split_output(problem, (result.output, *result.extras))
    div, judgement = _judge_outputs(problem, outputs, traces, baselines, "float32", options)
    cond_max = record["ieee_dots_cond_max"] = div.cond_max
    found = f"TF32: the same call with IEEE float32 Triton dots is equivalent (cond_max {cond_max:.3g})"
    if judgement.verdict is not Verdict.EQUIVALENT and chunked is not None:
        chunk, at, judgement = chunked.smallest(outputs, baselines, "float32", options)
        found = ("TF32 and chunk rounding: the same call with IEEE float32 Triton dots is "
                 + _CHUNK_CLAUSE.format(chunk=chunk, cond_max=at.cond_max))
    if judgement.verdict is not Verdict.EQUIVALENT:
        return None
    return (f"{found}; its float32 tl.dot run in TF32, Triton's default: pass input_precision='ieee' to tl.dot, or "
            "declare Capabilities(computes_in={'float32': 'tf32_rz'}) (Triton's TF32 truncates)")


#: The share of a divergent output's error before its first mismatch that must move, when only later
#: inputs change, for the divergence to be called a future leak. A causal kernel moves nothing there
#: (bit for bit, or by a rounding of a global rescaling), a leaking one by about twice the leaked part.
LEAK_SHARE = 0.5
#: Calls on the unchanged inputs that must each move the outputs less than that: a kernel whose outputs carry
#: fresh noise passed one such call by chance in 10 of 200 seeds (`tests/test_precision_edge.py`'s noisy
#: kernel), and two in none.
REPEATS = 2


def _future_leak(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], output: torch.Tensor,
                 trace: Any, onset_t: int, options: RunOptions, kernel_fn: Callable | None,
                 worker: Any) -> str | None:
    """Whether a divergence at ``onset_t`` (its first mismatch) comes from inputs after it: the why's
    clause if so, else None.

    The kernel runs again in the case's dtype with the sign of the family's ``linear_input`` flipped at
    every position after ``onset_t`` (and `REPEATS` times on the unchanged inputs, to tell a leak from noise) (exact in every dtype; magnitudes, and so the domain, unchanged).
    A causal kernel's outputs up to ``onset_t`` do not move; where they move by at least `LEAK_SHARE` of
    their error against the oracle, the error is the future's contribution: an algebraic fault (a mask
    that lets later keys in, as yet-another-retnet 0.5.0's bfloat16 decay mask does when a decay rounds
    to 1), not precision lost in the dtype, whatever the float64 rerun says.
    """
    name = problem.definition.linear_input
    axis = problem.length_axis
    if name is None or name not in inputs or onset_t >= problem.length - 1:
        return None
    f64 = torch.float64

    def up_to_onset(out: torch.Tensor) -> torch.Tensor:
        return out.detach().to("cpu", f64).narrow(axis, 0, onset_t + 1)

    def rerun(on: dict[str, torch.Tensor]) -> torch.Tensor | None:  # on copies: the case keeps its inputs
        result = _call_kernel(spec, problem, {k: v.clone() for k, v in on.items()}, options, kernel_fn, worker, False)
        out = problem.definition.split_output(problem, (result.output, *result.extras)).get("output") \
            if result.ok else None
        return up_to_onset(out) if isinstance(out, torch.Tensor) and out.shape == output.shape else None

    def largest(t: torch.Tensor) -> float:
        finite = t[torch.isfinite(t)]
        return float(finite.max()) if finite.numel() else 0.0

    x = inputs[name].clone()
    x.narrow(axis, onset_t + 1, problem.length - onset_t - 1).neg_()
    first, flipped = up_to_onset(output), rerun({**inputs, name: x})
    if flipped is None:
        return None
    moved = largest((first - flipped).abs())
    error = largest((first - trace.out.narrow(axis, 0, onset_t + 1)).abs())
    if not (moved > 0.0 and moved >= LEAK_SHARE * error):
        return None
    for _ in range(REPEATS):  # a kernel that does not repeat itself moves without any leak
        same = rerun(inputs)
        if same is None or not largest((first - same).abs()) < LEAK_SHARE * moved:
            return None
    return (f"future leak: flipping the sign of {name} after t={onset_t} moves the output at t <= {onset_t} by "
            f"up to {moved:.3g} (its error there: {error:.3g}); a causal kernel's would not move")


def _judge_outputs(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any],
                   baselines: dict[str, Any] | None, precision: str, options: RunOptions,
                   record: dict[str, Any] | None = None) -> tuple[Any, Judgement]:
    """(the output's `Divergence`, the judgement of every target) of a kernel's ``outputs`` against
    ``traces``: the case's own measurement (its final state's fields go into ``record``) and what a
    counterfactual compares (another call of the kernel, or the same output against another bound)."""
    from harness.metrics import measure

    div = measure(outputs["output"], traces["output"], dtype=precision,
                  baseline=None if baselines is None else baselines["output"], length_axis=problem.length_axis,
                  tf32=problem.tf32, cond_threshold=options.policy.cond_threshold, function_room=problem.function_room)
    judgement = judge(div, options.policy)
    if "final_state" in traces:
        judgement = _final_state(problem, traces["final_state"], outputs.get("final_state"),
                                 None if baselines is None else baselines.get("final_state"),
                                 precision, options, {} if record is None else record, judgement)
    return div, judgement


def judged_output(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], output: torch.Tensor,
                  options: RunOptions, confirm: Callable[[], dict[str, Any] | None] | None = None,
                  ) -> tuple[Any, Judgement]:
    """The output of another call of ``spec`` on this case (its forward with inputs requiring grad,
    `gradients.gradient_case`) measured and judged as `run_case` judges its own: the same oracle trace, chunk
    term (or assumed chunk, `_judged_at_assumed_chunk`, in half precision only as ``confirm`` confirms it: the same
    call's verdict in float64), same-dtype loop and precision; the output only (no final state)."""
    traces = chunk_term_at(spec, problem, inputs, reference_traces)
    precision = spec.capabilities.precision(problem.dtype)
    storage = dtypes.dtype_key(dtypes.torch_dtype(precision))
    try:
        baselines = baseline_outputs(problem.replace(dtype=storage),
                                     {k: v.to(DTYPE_NAMES[storage]) for k, v in inputs.items()}, spec.convention)
    except Exception:  # noqa: BLE001 - judged without the loop, as run_case does when it fails
        baselines = None
    outputs, baselines = {"output": output}, None if baselines is None else {"output": baselines["output"]}
    div, judgement = _judge_outputs(problem, outputs, {"output": traces["output"]}, baselines, precision, options)
    if judgement.verdict is Verdict.DIVERGENT and assumes_chunk(spec, problem, options):  # as run_case's own
        confirm = (confirm or (lambda: None)) if precision in CONFIRMED_IN_FLOAT64 else None
        div, judgement = _judged_at_assumed_chunk(_AssumedChunks(spec, problem, inputs), div, judgement, outputs,
                                                  baselines, precision, options, {}, confirm)
    return div, judgement


#: The chunk sizes a gated or selective-scan kernel that declares none is judged at (`_AssumedChunks`), smallest
#: first: the blocks of fla's and most Triton chunk kernels (powers of two that Triton's ``tl.dot`` allows; fla's
#: ``chunk_simple_gla`` fixes 64 inside and takes no chunk_size). The smallest whose bound holds is taken, so that
#: the bound is no looser than the tightest chunk form that explains the output.
ASSUMED_CHUNK_SIZES: tuple[int, ...] = (16, 32, 64, 128)


def assumes_chunk(spec: KernelSpec, problem: Problem, options: RunOptions) -> bool:
    """Whether a divergent case of ``spec`` is judged again at assumed chunk sizes (`_AssumedChunks`): a gated or
    selective-scan kernel that declares no chunk size (none in its capabilities, none read from its signature), on
    more than one step (one step has no cumulative sum to round: a half-only bug of a step loop, shrunk to L = 1,
    was told to declare a chunk size)."""
    return bool(options.chunk_counterfactual and problem.definition.chunk_term and problem.chunk_size is None
                and not spec.capabilities.takes_chunk and problem.length > 1)


#: The dtypes whose assumed chunk is confirmed by the same inputs in float64 (`_judged_at_assumed_chunk`): those
#: whose chunk term can reach an output's magnitude (u * 128 steps of strong decay's log-decay mass > 1), where an
#: algebraic slip can hide in it; in float32 it stays near 1e-4 of the state's magnitude.
CONFIRMED_IN_FLOAT64: tuple[str, ...] = ("float16", "bfloat16")


def runs_float64(spec: KernelSpec, problem: Problem, options: RunOptions) -> bool:
    """Whether an assumed chunk of a half-precision case of ``spec`` can be confirmed by a float64 run of its inputs:
    second-dtype runs are on, and the kernel runs float64 here."""
    return options.precision_counterfactual and spec.capabilities.runs("float64", problem.device) is None


#: The why's clause of an assumed chunk refused for want of a float64 run (`_judged_at_assumed_chunk`).
UNCONFIRMED = ("no float64 run confirms it (the kernel does not run float64 here, second-dtype runs are off, or that "
               "run judged nothing there), and in half precision a chunk term can hold an algebraic slip: not assumed")


def assumed_chunk_sizes(length: int) -> tuple[int, ...]:
    """The `ASSUMED_CHUNK_SIZES` that bound a case of ``length`` steps differently: those shorter than it, and the
    first that spans it (a chunk of L steps or more is one chunk of the whole sequence, whatever its size)."""
    shorter = tuple(chunk for chunk in ASSUMED_CHUNK_SIZES if chunk < length)
    spanning = next((chunk for chunk in ASSUMED_CHUNK_SIZES if chunk >= length), None)
    return shorter + (() if spanning is None else (spanning,))


class _ChunkedTraces:
    """The oracle's traces of ``problem`` at chunk ``chunk``, computed once when first asked."""

    def __init__(self, spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], chunk: int):
        self.problem = problem.replace(chunk_size=chunk)
        self._spec, self._inputs, self._traces = spec, inputs, None

    @property
    def traces(self) -> dict[str, Any]:
        if self._traces is None:
            self._traces = reference_traces(self.problem, self._inputs, self._spec.convention)
        return self._traces

    def judge(self, outputs: dict[str, Any], baselines: dict[str, Any] | None, precision: str,
              options: RunOptions, fields: dict[str, Any] | None = None) -> tuple[Any, Judgement]:
        """(the `Divergence`, the judgement) of ``outputs`` against the chunked traces; the final state's fields go
        into ``fields``."""
        return _judge_outputs(self.problem, outputs, self.traces, baselines, precision, options, fields)


class _AssumedChunks:
    """The oracle's traces of a case of a kernel that declares no chunk size, at each of `assumed_chunk_sizes`
    (an oracle run each, computed when first asked; no kernel call)."""

    def __init__(self, spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor]):
        self.problem = problem
        self._spec, self._inputs = spec, inputs
        self._at = [_ChunkedTraces(spec, problem, inputs, chunk) for chunk in assumed_chunk_sizes(problem.length)]

    def smallest(self, outputs: dict[str, Any], baselines: dict[str, Any] | None, precision: str,
                 options: RunOptions, fields: dict[str, Any] | None = None) -> tuple[int | None, Any, Judgement]:
        """(chunk, `Divergence`, judgement) of ``outputs`` at the smallest assumed chunk size where they are not
        divergent (its final state's fields into ``fields``); (None, the measurement at the largest, its judgement)
        where they are at none. Not divergent is equivalent, or out_of_domain where the chunk term leaves some
        elements no guaranteed digit (half precision under strong decay) and the others are within it: what a kernel
        that declares that chunk gets there. A larger chunk's bound only widens, so the first one is the tightest."""
        for chunked in self._at:
            found: dict[str, Any] = {}
            div, judgement = chunked.judge(outputs, baselines, precision, options, found)
            if judgement.verdict in (Verdict.EQUIVALENT, Verdict.OUT_OF_DOMAIN):
                if fields is not None:
                    fields.update(found)
                return chunked.problem.chunk_size, div, judgement
        return None, div, judgement

    def whole_sequence(self) -> "_ChunkedTraces | None":
        """The traces at one chunk of the whole length (decays from cumulative sums over the sequence, a parallel
        form's); None where the largest assumed chunk spans the sequence already."""
        length = self.problem.length
        return None if length <= ASSUMED_CHUNK_SIZES[-1] else _ChunkedTraces(self._spec, self.problem, self._inputs,
                                                                             length)


def _judged_at_assumed_chunk(chunked: _AssumedChunks, div: Any, judgement: Judgement, outputs: dict[str, Any],
                             baselines: dict[str, Any] | None, precision: str, options: RunOptions,
                             record: dict[str, Any], confirm: Callable[[], dict[str, Any] | None] | None = None,
                             ) -> tuple[Any, Judgement]:
    """A divergent case of a kernel that declares no chunk size, judged as what it may be: a chunk form.

    A chunk form forms its decays as exp of differences of cumulative sums, which loses ``u`` times the
    within-chunk log-decay mass (the oracle's chunk term, `reference_impls.gated_decay`); the bound carries it
    only for a kernel whose chunk size the harness knows (declared, or read from its signature,
    `harness.signatures`). A chunk kernel with its block fixed inside (fla's ``chunk_simple_gla`` named
    directly, a user's Triton kernel with ``BT = 64``) declares none. The same output is judged once more
    against the oracle's traces at each of `assumed_chunk_sizes` (no kernel call); at the smallest where it is not
    divergent (`_AssumedChunks.smallest`), that is the case's measurement and judgement, the record's
    ``assumed_chunk_size`` says which chunk was assumed (the why too), and ``unchunked_cond_max`` keeps the cond
    error against the loop's bound.
    At none, ``(div, judgement)`` are returned as they are and ``chunked_cond_max`` records the cond error at the
    largest: a slip at a chunk boundary, or a last partial chunk dropped, errs far beyond every chunk's bound.

    In half precision (`CONFIRMED_IN_FLOAT64`) the chunk term of a long chunk under strong decay reaches the
    output's magnitude, and an algebraic slip can hide in it (a state carried into a chunk undecayed, at bfloat16
    cond 1.7 against the loop's bound, was within chunk 64's). There ``confirm`` runs the same inputs in float64,
    judged with the same assumption (None where it cannot, `runs_float64`): the assumption holds only where that run
    is equivalent, a chunk form's rounding that shrinks with u; otherwise it is refused and the why says why (the
    float64 run is kept for `_precision_counterfactual`).
    """
    t0 = time.perf_counter()
    fields: dict[str, Any] = {}
    chunk, at, there = chunked.smallest(outputs, baselines, precision, options, fields)
    record["t_assumed_chunk"] = round(time.perf_counter() - t0, 6)
    if chunk is None:
        record["chunked_cond_max"] = at.cond_max
        return div, judgement
    refused = None if confirm is None else assumption_refused(confirm())
    if refused is not None:
        record["chunked_cond_max"] = at.cond_max
        return div, Judgement(judgement.verdict, f"{judgement.why}; within a chunked form's bound at chunk {chunk} "
                                                 f"(cond_max {at.cond_max:.3g}), but {refused}", judgement.rule)
    unchunked = {"unchunked_cond_max": div.cond_max}
    if record.get("final_state_cond_max") is not None:
        unchunked["unchunked_final_state_cond_max"] = record["final_state_cond_max"]
    for key in [k for k in record if k.startswith("final_state_") or k == "verdict_target"]:
        del record[key]  # the chunk-less judgement's final state: the chunked one replaces it
    record.update(fields, assumed_chunk_size=chunk, **unchunked)
    return at, Judgement(there.verdict, f"{there.why}; {assumed_chunk_clause(chunk, div.cond_max)}", there.rule)


def assumption_refused(wide: dict[str, Any] | None) -> str | None:
    """Why the float64 run ``wide`` (a record, a gradient's too; None: not made) does not confirm an assumed chunk,
    or None where it does (equivalent)."""
    if wide is None:
        return UNCONFIRMED
    if wide.get("verdict") == Verdict.EQUIVALENT.value:
        return None
    cond = wide.get("cond_max")
    return (f"the same inputs in float64 are {wide.get('verdict')}"
            + (f" (cond_max {cond:.3g})" if isinstance(cond, float) else "")
            + " at every assumed chunk: not a chunk form's rounding")


def assumed_chunk_clause(chunk: int, unchunked_cond_max: float) -> str:
    """The why's note of a case judged at an assumed chunk size (`_judged_at_assumed_chunk`, a gradient's too)."""
    return (f"assumed chunk: judged against a chunked form's bound at chunk {chunk} (assumed: the kernel declares no "
            "chunk size; declare it to be judged at its own: a chunk_size parameter, or Capabilities(chunk_sizes=...) "
            f"in a KernelSpec); against the chunk-less loop's bound its cond_max is {unchunked_cond_max:.3g}")


def _sequence_bound(whole: _ChunkedTraces, outputs: dict[str, Any], baselines: dict[str, Any] | None,
                    precision: str, options: RunOptions, record: dict[str, Any]) -> str | None:
    """Whether a divergent case is within the bound of decays formed over the whole sequence (``whole``: the
    oracle's traces at one chunk of the whole length): the why's clause, advising
    ``Capabilities(decays_across_chunks=True)``, if so, else None. For a kernel that declares no chunk size
    (`_AssumedChunks.whole_sequence`: past the largest assumed chunk, where none of their bounds holds) and one
    handed a chunk size that it does not use so (a
    blind hunt's correct quadratic SSD form, session 25: cond 1.08 in float64, and no word of the declaration that
    passes it). The verdict stays: the harness cannot know how the kernel forms its decays; for a kernel handed a
    chunk size the cause stays too (advice only)."""
    div, judgement = whole.judge(outputs, baselines, precision, options)
    cond_max = record["sequence_cond_max"] = div.cond_max
    if judgement.verdict is not Verdict.EQUIVALENT:
        return None
    return f"chunk rounding: {_SEQUENCE_CLAUSE.format(cond_max=cond_max)}"


def _declared_chunk_precision(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor],
                              outputs: dict[str, Any], baselines: dict[str, Any] | None, precision: str,
                              options: RunOptions, record: dict[str, Any]) -> str | None:
    """Whether a divergent case of a kernel that declares its chunk decays finer than the case's dtype
    (`Capabilities.chunk_computes_in`) is within the bound of decays formed in the case's dtype: the why's
    clause if so (the declaration does not hold), else None. A blind hunt's kernel declared float32 sums and
    formed them in float16: "precision_loss", with no word of the declaration it was judged by (session 23)."""
    plain = reference_traces(chunk_blocking(spec, problem), inputs, spec.convention)
    div, judgement = _judge_outputs(problem, outputs, plain, baselines, precision, options)
    if not explains(judgement):
        return None
    return (f"declared chunk precision: judged with its chunk decays at {record['chunk_precision']}'s rounding, as "
            f"it declares (chunk_computes_in), it is within the bound of decays formed in {problem.dtype} (cond_max "
            f"{div.cond_max:.3g}): it forms them in {problem.dtype}; drop the declaration or form them in "
            f"{record['chunk_precision']}")


_CHUNK_CLAUSE = ("within the bound of a chunked form with chunk {chunk} (cond_max {cond_max:.3g}), "
                 "whose decays are exp of differences of cumulative sums; if the kernel chunks, declare its chunk "
                 "size (a chunk_size parameter, or Capabilities(chunk_sizes=...) in a KernelSpec) and the bound "
                 "carries that term; if its cumulative sums span the whole sequence (a parallel form), declare "
                 "Capabilities(decays_across_chunks=True)")
_SEQUENCE_CLAUSE = ("within the bound of a form whose decays are exp of differences of cumulative sums over the whole "
                    "sequence (cond_max {cond_max:.3g}); if the kernel forms them so (a parallel form, or chunks whose "
                    "states pass by such sums), declare Capabilities(decays_across_chunks=True) and the bound carries "
                    "that term")


#: A divergent output whose best constant factor against the oracle's is within this of 1 is not called
#: a scale (`_constant_factor`): the factor must be the finding, not the least-squares noise of a bug.
FACTOR_MIN_OFFSET = 1e-3
#: The least-squares factor itself (not a usual one) is tried only on outputs of at least this many finite
#: elements: one element is always some factor of the oracle's, and a shrunk case of a wrong kernel has few
#: (a kernel that ignored its initial state was named a factor on a 2-element case).
FACTOR_MIN_ELEMENTS = 16
#: ... and a usual factor, in float16 and bfloat16, on at least this many: a wrong value there lies within
#: the bound of gamma or -1 times the oracle's by chance now and then, four of them together practically
#: never (in float32 and float64 the bound is too narrow for chance: one element is enough).
FACTOR_MIN_ELEMENTS_KNOWN = 4
#: How far (relative) a least-squares factor may lie from a usual one for that one to be tried.
FACTOR_NEAR = 0.05


def _constant_factor(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any],
                     baselines: dict[str, Any] | None, precision: str, options: RunOptions,
                     record: dict[str, Any], convention: RetentionConvention = RETNET) -> str | None:
    """Whether a divergent output is the oracle's times a constant c: the why's clause if so, else None.

    A kernel on another scale convention (the ``K**-0.5`` of attention-like forms left out, applied twice,
    taken from the wrong head dimension) or with its sign flipped is off at every element by one factor:
    an algebraic difference, not rounding, but one the author fixes by reading the family's convention,
    not by hunting a bug. c is the least-squares factor over the elements where both are finite. The
    output is judged once more against the oracle's trace times a factor (the output, its magnitude and
    growth scaled, so the bound scales with it; the same-dtype loop's output times it) and the other
    targets as they are: first at each usual factor within `FACTOR_NEAR` of c, the nearest first
    (`_known_factors`: the sign, a scale from the wrong head dimension, a one-head retention's gamma; a
    low-precision c strays from it by the dtype's rounding), then at c itself. Equivalent at one (or every
    element it can judge agreeing there, the rest out of the precision domain), the cause is
    ``constant_factor`` with the factor and its meaning in the why, and the record's ``constant_factor``,
    ``constant_factor_cond_max``. The verdict stays divergent."""
    target = "final_state" if record.get("verdict_target") == "final_state" else "output"
    out = outputs.get(target)
    if out is None or target not in traces:
        return None
    for factor, meaning in factors_to_try(problem, out, traces[target].out, precision, convention, target):
        cond_max, explained = _judge_at_factor(problem, outputs, traces, baselines, precision, options, factor,
                                               target)
        record["constant_factor"], record["constant_factor_cond_max"] = factor, cond_max
        if explained and factor_gains(record.get(f"{'final_state_' if target == 'final_state' else ''}cond_max"),
                                      cond_max):
            return factor_clause(target.replace("_", " "), factor, cond_max, meaning)
    return None


def factors_to_try(problem: Problem, actual: torch.Tensor, exact: torch.Tensor, precision: str,
                   convention: RetentionConvention = RETNET, target: str = "output") -> list[tuple[float, str]]:
    """The constant factors (with what each means) that ``actual`` may be ``exact`` times, in the order to
    try them: the usual ones within `FACTOR_NEAR` of the least-squares factor c, nearest first, then c
    itself; none when c is not finite, 0, or within `FACTOR_MIN_OFFSET` of 1, or with fewer than
    `FACTOR_MIN_ELEMENTS_KNOWN` finite elements in a half precision (c itself: `FACTOR_MIN_ELEMENTS`, and only
    where the typical element is c times the oracle's, not 1 times: `_typical_ratio_near`).
    `_constant_factor` asks, and the gradients' check (`harness.gradients`)."""
    x, o = actual.detach().to("cpu", torch.float64), exact.detach().to("cpu", torch.float64)
    both = torch.isfinite(x) & torch.isfinite(o)
    # both scaled by one power of two first: the squares of float64 values near 1e-229 (the tiny regime) are 0, and
    # a kernel off by exactly dk/dv there was left a kernel_bug, not named a constant factor (a blind hunt, s. 28)
    peak = float(o[both].abs().max()) if bool(both.any()) else 0.0
    scale = 2.0 ** min(1000, -math.frexp(peak)[1]) if peak > 0 else 1.0  # 2**1074 (a subnormal peak) overflows
    xs, os_ = x[both] * scale, o[both] * scale
    oo = float((os_ * os_).sum())
    if not (math.isfinite(oo) and oo > 0):
        return []
    c = float((xs * os_).sum()) / oo
    n = int(both.sum())
    few = FACTOR_MIN_ELEMENTS_KNOWN if precision in ("float16", "bfloat16") else 1
    if not math.isfinite(c) or c == 0 or abs(c - 1) <= FACTOR_MIN_OFFSET or n < few:
        return []
    known = _known_factors(problem, convention, target)
    near = sorted((abs(f - c), i) for i, (f, _) in enumerate(known)
                  if abs(f - c) <= FACTOR_NEAR * abs(f))  # ties: the more specific meaning, listed first
    tries = [known[i] for _, i in near]
    # a final state carries no convention but a scale folded into k (`_known_factors`): another factor there is a
    # decay's (a padded tail chunk decayed the state by exp(pad * g): "0.91 times, another convention", blind
    # hunt, session 23)
    if (target != "final_state" and n >= FACTOR_MIN_ELEMENTS
            and _typical_ratio_near(x[both], o[both], c)):  # a few elements: some factor always
        tries.append((c, "another scale or sign convention than the family's (the README's kernel contract)"))
    return tries


def _typical_ratio_near(actual: torch.Tensor, exact: torch.Tensor, c: float) -> bool:
    """Whether the median of ``actual / exact`` over the elements of ``exact`` that are not tiny (above 1e-3 of its
    largest) lies nearer the least-squares factor ``c`` than 1. A convention moves every element by c; a slip at a
    few elements leaves the rest at 1, and their least-squares factor near 1, where the bound of the rest holds
    it too (a blind hunt's chunk-boundary slip, float16, L = 32, one element of 32 off, was "1.0026 times the
    oracle's: another scale or sign convention")."""
    big = exact.abs() > 1e-3 * float(exact.abs().max())
    if not bool(big.any()):
        return True
    typical = float((actual[big] / exact[big]).median())
    return abs(typical - c) < abs(typical - 1.0)


#: How much a constant factor must shrink the cond error to be named: at most this times the error without it. A
#: bound so wide that it admits a few percent of rescale (bfloat16, dk = 17) passed a one-head chunk-boundary
#: slip at gamma = 0.96875, cond 1.0017 -> 0.998: "the state decayed once more than the definition", for ratios
#: to the exact gradient from -4.1 to 14.2 (a blind hunt, session 24). A convention moves every element by the
#: factor, and at it the error falls to rounding: by orders of magnitude.
FACTOR_GAIN = 0.5


def factor_gains(cond_before: Any, cond_at: float) -> bool:
    """Whether judging at a factor shrank the cond error enough to name it (`FACTOR_GAIN`); a cond that could
    not be measured (NaN, None) on either side does not stop it."""
    try:
        before, at = float(cond_before), float(cond_at)
    except (TypeError, ValueError):
        return True
    return not at > FACTOR_GAIN * before


def factor_clause(what: str, factor: float, cond_max: float, meaning: str) -> str:
    """The why's clause of a ``constant_factor`` cause."""
    return (f"constant factor: the {what} is {factor:.6g} times the oracle's, and equivalent at that factor "
            f"(cond_max {cond_max:.3g}): {meaning}")


def _judge_at_factor(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any],
                     baselines: dict[str, Any] | None, precision: str, options: RunOptions,
                     factor: float, target: str = "output") -> tuple[float, bool]:
    """(cond_max, explained) of ``outputs`` against the oracle's ``target`` (the output, or a gated case's final
    state) times ``factor``, the other target as it is: explained when equivalent, or when every element that
    can be judged agrees (the rest out of the precision domain)."""
    scaled = dict(traces, **{target: traces[target].scaled(factor)})
    base = baselines
    if baselines is not None and baselines.get(target) is not None:
        b = baselines[target]
        base = dict(baselines, **{target: (b.to(torch.float64) * factor).to(b.dtype)})
    found: dict[str, Any] = {}
    div, judgement = _judge_outputs(problem, outputs, scaled, base, precision, options, found)
    cond = found.get("final_state_cond_max", div.cond_max) if target == "final_state" else div.cond_max
    return cond, explains(judgement)


#: The families whose convention carries a scale ``dk**-0.5`` on the query (`_known_factors`).
_SCALED_FAMILIES = (Family.RETENTION, Family.RETENTION_NORMED, Family.SIMPLE_GLA, Family.GLA)


def _known_factors(problem: Problem, convention: RetentionConvention = RETNET,
                   target: str = "output") -> list[tuple[float, str]]:
    """The usual constant factors of a wrong output, signed, with what each means: a flipped sign; a scale
    from the wrong head dimension (left out, applied twice, ``dv**-0.5``) or a ``scale=`` passed and ignored;
    after the normed retention's RMS norm, which cancels a scale, the norm's own (its mean over dk, its sum
    not divided by dv, divided twice); a one-head retention's gamma (the state decayed once too often). For a
    gated case's final state (``target``), which carries no scale, only the scale folded into k."""
    known: list[tuple[float, str]] = []
    if problem.family in _SCALED_FAMILIES:
        dk, dv = problem.dk, problem.dv
        given = problem.scale
        if target == "final_state":  # the state carries no scale: one there was folded into k (or v)
            used = given or dk ** -0.5
            known.append((used, f"{'the scale=' + format(given, 'g') if given else 'the scale dk**-0.5'} folded "
                                "into k, so the state carries it"))
        elif given:  # a case that passed scale= to a kernel that takes it (first: the more specific meaning)
            known += [(dk ** -0.5 / given, f"dk**-0.5 / scale: the scale={given:g} passed was ignored (dk**-0.5 used)"),
                      (1 / given, f"1 / scale: the scale={given:g} passed was ignored (no scale used)")]
        # after an RMS norm a scale cancels (but where eps outweighs the mean square): there a factor is the norm's
        normed = problem.family is Family.RETENTION_NORMED
        note = " (after the norm only where eps outweighs the mean square)" if normed else ""
        if normed and dk != dv:
            known.append(((dk / dv) ** 0.5, "(dk / dv)**0.5: the norm's mean square taken over dk where the family's "
                                            "is over dv (or, where eps outweighs it, the scale dv**-0.5 for dk**-0.5)"))
        if normed:
            known += [(dv ** -0.5, "dv**-0.5: the norm's root of the sum of squares, not of their mean"),
                      (dv ** 0.5, "dv**0.5: the norm's mean square divided by dv twice")]
        if target != "final_state":
            known += [(dk ** 0.5, f"dk**0.5: the scale dk**-0.5 left out{note}"),
                      (dk ** -0.5, f"dk**-0.5: the scale dk**-0.5 applied twice{note}")]
        if dk != dv and not normed and target != "final_state":
            known.append(((dk / dv) ** 0.5, "(dk / dv)**0.5: the scale dv**-0.5 where the family's is dk**-0.5"))
    if problem.family in (Family.RETENTION, Family.RETENTION_NORMED) and problem.heads == 1:
        known.append((float(convention.gammas(1)[0]), "gamma: the state decayed once more than the definition "
                                                      "(gamma (S + k^T v) for gamma S + k^T v)"))
    out = [(-1.0, "the sign is flipped")]
    for value, meaning in known:
        out += [(value, f"{value:.6g} = {meaning}"), (-value, f"{value:.6g} = {meaning}, and the sign flipped")]
    return out


def _swapped_layout(problem: Problem, inputs: dict[str, torch.Tensor], outputs: dict[str, Any], precision: str,
                    options: RunOptions, record: dict[str, Any],
                    convention: RetentionConvention = RETNET) -> str | None:
    """Whether a divergent output is the oracle's on the inputs read with axes 1 and 2 swapped: the why's
    clause if so, else None.

    A kernel written for another layout (fla's old ``head_first`` (batch, heads, T, d) given the family's
    (batch, T, heads, d); a channels-last scan) runs without complaint when the shapes allow it and
    computes the recurrence along the wrong axis. The family's `FamilyDef.swapped_layout` names the axis
    next to the sequence's; the oracle runs once more on the problem with the two sizes exchanged and the
    inputs transposed, its trace is transposed back, and the output is judged against it (no baseline:
    the bound alone). Equivalent there (or every judgeable element agreeing), the cause is ``layout``
    and the record has ``layout_cond_max``. Not tried with an initial or final state or packed sequences
    (their shapes do not swap). The verdict stays divergent."""
    from dataclasses import replace

    definition = problem.definition
    if definition.swapped_layout is None or outputs.get("output") is None:
        return None
    if precision in ("float16", "bfloat16") and outputs["output"].numel() < FACTOR_MIN_ELEMENTS_KNOWN:
        return None  # as for a factor: a few half-precision values may agree with another layout by chance
    if problem.has_initial_state or problem.final_state or problem.cu_seqlens is not None:
        return None
    field_name, layout = definition.swapped_layout
    try:
        swapped = problem.replace(length=getattr(problem, field_name), **{field_name: problem.length})
    except (InvalidArgument, ValueError):
        return None
    x = {k: v.transpose(1, 2) for k, v in inputs.items()}
    trace = reference_traces(swapped, x, convention)["output"]
    back = replace(trace, **{f: getattr(trace, f).transpose(1, 2) for f in
                             ("out", "magnitude", "growth", "state_peak", "decay_peak", "norm_peak")
                             if getattr(trace, f) is not None})
    div, judgement = _judge_outputs(problem, {"output": outputs["output"]}, {"output": back}, None, precision,
                                    options)
    record["layout_cond_max"] = div.cond_max
    if not explains(judgement):
        return None
    return (f"layout: the output is the oracle's on the inputs read as {layout} (axes 1 and 2, the sequence and "
            f"{field_name}, swapped; cond_max {div.cond_max:.3g}): the kernel takes another layout than the "
            f"family's; transpose(1, 2) its inputs and its output in a wrapper")


def _named_slip(problem: Problem, inputs: dict[str, torch.Tensor], outputs: dict[str, Any], precision: str,
                options: RunOptions, record: dict[str, Any], convention: RetentionConvention = RETNET) -> str | None:
    """Whether a divergent output is what a kernel returns that leaves out one of the case's optional terms (D,
    the gate silu(z), the step's bias) or its softplus, or adds the bias after the softplus: the why's clause
    naming the first such slip, else None.

    The oracle and the same-dtype loop run once more per slip of the family (`FamilyDef.slips`) and the output is
    judged against them as a case is (a step left without its softplus grows, and the bound alone is not enough),
    the loop vouching for the slip only where its own error is inside the bound. The cause stays ``kernel_bug``:
    the slip is the bug, and the clause says which. A blind hunt's selective scan without D was shrunk to L = 1 with nothing but ACTUAL and DESIRED to go on.
    As for a factor, a half-precision output of a few elements is not tried (`FACTOR_MIN_ELEMENTS_KNOWN`). The
    record has ``slip`` (what the kernel does) and ``slip_cond_max``."""
    out = outputs.get("output")
    if out is None:
        return None
    if precision in ("float16", "bfloat16") and out.numel() < FACTOR_MIN_ELEMENTS_KNOWN:
        return None
    storage = dtypes.dtype_key(dtypes.torch_dtype(precision))
    for what, variant, x in problem.definition.slips(problem, inputs):
        try:
            trace = reference_traces(variant, x, convention)["output"]
            loop = baseline_output(variant.replace(dtype=storage), {k: v.to(DTYPE_NAMES[storage]) for k, v in x.items()},
                                   convention)
        except (InvalidArgument, ValueError, RuntimeError):
            continue
        div, judgement = _judge_outputs(problem, {"output": out}, {"output": trace},
                                        None if loop is None else {"output": loop}, precision, options)
        threshold = options.policy.cond_threshold
        # the loop vouches for the slip only where it is inside the bound itself: a bfloat16 `large` case's loop
        # without softplus erred 5x over it, and three other bugs read "does not apply softplus" through it
        vouched = div.cond_max <= threshold or div.baseline_cond_max <= threshold  # NaN: no loop, no vouching
        if explains(judgement) and vouched:
            record["slip"], record["slip_cond_max"] = what, div.cond_max
            return f"slip: the output is the oracle's for a kernel that {what} (cond_max {div.cond_max:.3g})"
    return None


def explains(judgement: Judgement) -> bool:
    """A counterfactual judgement that explains a divergent case: equivalent, or every element it can judge
    agreeing (the rest out of the precision domain)."""
    return judgement.verdict is Verdict.EQUIVALENT or (
        judgement.verdict is Verdict.OUT_OF_DOMAIN and judgement.rule == "partial_domain")


#: Verdicts from the worst down: the record of a case with several targets takes the worst.
SEVERITY = (Verdict.KERNEL_ERROR, Verdict.DIVERGENT, Verdict.OUT_OF_DOMAIN, Verdict.EQUIVALENT)


#: The final state's measurement kept in a record whose verdict it decides (``final_state_<key>``), so that
#: the failure message shows the final state's worst element, not the (equivalent) output's
#: (`harness.verdict.format_failure`).
FINAL_STATE_SHOWN = ("shape", "axis_names", "length", "length_axis", "n_elements", "n_in_domain", "n_compared",
                     "n_mismatch", "worst_index", "worst_actual", "worst_desired", "worst_abs", "worst_cond",
                     "worst_bound", "cond_p99", "ulp_p99", "onset_t", "n_out_of_domain", "domain_onset_t",
                     "domain_cause", "n_precision_exhausted", "has_baseline", "baseline_cond_max",
                     "baseline_max_abs", "baseline_ratio", "max_error_first_half", "max_error_second_half",
                     "growth_exponent")


def _final_state(problem: Problem, trace, got: torch.Tensor | None, baseline: torch.Tensor | None,
                 precision: str, options: RunOptions, record: dict[str, Any], judgement: Judgement) -> Judgement:
    """Measure the final state (the second target of a gated case) and record it as ``final_state_*``;
    return the record's judgement: the output's, or the final state's where that one is worse (its why
    then says so). A final state that is missing or of the wrong shape is a kernel error."""
    from harness.metrics import measure

    want = tuple(trace.out.shape)
    taken = (problem.torch_dtype, torch.float32)  # the case's, or float32 (fla keeps a half case's state so)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == want and got.dtype not in taken:
        expected = (f"{problem.torch_dtype} (the case's)" + (" or torch.float32" if problem.torch_dtype != torch.float32
                                                              else ""))
        state = judge({}, options.policy, kernel_error=f"returned a final state of dtype {got.dtype}, expected {expected}")
        record["final_state_outcome"] = "wrong_dtype"
    elif not isinstance(got, torch.Tensor) or tuple(got.shape) != want:
        what = "no final state" if not isinstance(got, torch.Tensor) else f"a final state of shape {tuple(got.shape)}"
        hint = shape_hint(tuple(got.shape), want) if isinstance(got, torch.Tensor) else ""
        state = judge({}, options.policy, kernel_error=f"returned {what}, expected shape {want}{hint}")
        # the contract outcome, as the output's would be (the record's cause when this makes it a kernel error)
        record["final_state_outcome"] = "wrong_shape" if isinstance(got, torch.Tensor) else "not_a_tensor"
    else:
        div = measure(got, trace, dtype=precision, baseline=baseline, length_axis=0, tf32=problem.tf32,
                      cond_threshold=options.policy.cond_threshold, function_room=problem.function_room,
                      element_axes_names=("sequence", "head", "k", "v"))
        state = judge(div, options.policy)
        found = div.to_dict()
        for key in ("cond_max", "max_abs", "max_rel", "ulp_max"):
            if key in found:
                record[f"final_state_{key}"] = found[key]
    record["final_state_verdict"] = state.verdict.value
    record["final_state_why"] = state.why
    if SEVERITY.index(state.verdict) < SEVERITY.index(judgement.verdict):
        record["verdict_target"] = "final_state"  # the counterfactuals then compare the final state's errors
        if isinstance(got, torch.Tensor) and tuple(got.shape) == want and got.dtype in taken:  # the message shows
            record.update({f"final_state_{key}": found[key] for key in FINAL_STATE_SHOWN if key in found})
        # its positions are sequences (packed rows), not steps
        return Judgement(state.verdict, "final state: " + state.why.replace(", from t=", ", from sequence "),
                         state.rule)
    return judgement


#: How far apart the cond errors of one case in two dtypes may lie for its error to count as rounding
#: of the algorithm. A cond error is the error in units of the dtype's own rounding bound: an algorithm's
#: rounding shrinks with the unit roundoff, so its cond error is about the same in both dtypes (within a
#: few times: different roundings); a mistake's error does not shrink, so its cond error grows by
#: u_low / u_high, 5.4e8 from float32 to float64 (bfloat16: 3.5e13).
PRECISION_SCALING = 1e3


def _scales_with_roundoff(cond_high: Any, cond_low: Any) -> bool:
    """Whether a cond error ``cond_high`` in the wider dtype is no more than `PRECISION_SCALING` times the
    same case's ``cond_low`` in the narrower one (both finite, the narrower one > 0)."""
    return (isinstance(cond_high, float) and isinstance(cond_low, float) and math.isfinite(cond_high)
            and math.isfinite(cond_low) and cond_low > 0 and cond_high <= PRECISION_SCALING * cond_low)


def roundoff_scaling(wide: dict[str, Any], narrow: dict[str, Any], *, rounded: bool, whose: str = "") -> str | None:
    """The why's clause when the same case's cond errors in a wider and a narrower dtype (records, or their
    ``verdict``, ``cond_max``, ``n_kernel_nonfinite``, ``dtype``) scale with the unit roundoff
    (`_scales_with_roundoff`), both runs finite and judged; None otherwise. ``rounded``: the narrow run's inputs are
    the wide case's rounded (a float64 case rerun in float32). Outputs (`_precision_counterfactual`) and gradients
    (`harness.gradients._second_dtype`) are named by it alike."""
    judged = ("equivalent", "divergent")
    if (wide.get("n_kernel_nonfinite") or narrow.get("n_kernel_nonfinite") or wide.get("verdict") not in judged
            or narrow.get("verdict") not in judged
            or not _scales_with_roundoff(wide.get("cond_max"), narrow.get("cond_max"))):
        return None
    return (f"the error shrinks with the unit roundoff, as rounding does and a mistake does not: {whose}cond_max "
            f"{wide.get('cond_max'):.3g} in float64, {narrow.get('cond_max'):.3g} in {narrow.get('dtype')} on the same "
            f"inputs{' rounded to float32' if rounded else ''} (each in units of its own dtype's rounding bound)")


def rerun_options(options: RunOptions) -> RunOptions:
    """The options of a counterfactual rerun (eps 0, a second dtype; a gradient's too): ``options``' policy,
    timeout and isolation, with no probe or counterfactual of its own."""
    return RunOptions(options.policy, options.timeout_s, check_determinism=False, eps_counterfactual=False,
                      precision_counterfactual=False, future_leak_probe=False, tf32_counterfactual=False,
                      chunk_counterfactual=False, factor_counterfactual=False, layout_counterfactual=False,
                      isolation=options.isolation)


def inputs_in(dtype: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A case's inputs converted to ``dtype`` (exactly when it is wider); the others as they are."""
    return {k: v.to(DTYPE_NAMES[dtype]) if v.is_floating_point() else v for k, v in inputs.items()}


def _rerun_in(dtype: str, spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor],
              options: RunOptions, kernel_fn: Callable | None,
              keep_output: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """The record of the same case in ``dtype``, its inputs the case's own converted (exactly when wider)."""
    return run_case(spec, problem.replace(dtype=dtype, tf32=False), rerun_options(options), kernel_fn=kernel_fn,
                    inputs=inputs_in(dtype, inputs), keep_output=keep_output)


def _precision_counterfactual(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor],
                              options: RunOptions, kernel_fn: Callable | None, record: dict[str, Any],
                              judgement: Judgement, precision: str,
                              keep_output: dict[str, torch.Tensor] | None = None,
                              again: dict[str, Any] | None = None) -> tuple[str, Judgement]:
    """Tell precision lost by the algorithm from an algebraic mistake by running the case in a second dtype.

    A low-precision case reruns in float64 on the same rounded inputs (upcast exactly); a float64 case in
    float32 on its inputs rounded to float32 (where the kernel runs float32). The cause is
    ``precision_loss`` when the float64 run is equivalent, or when the two runs' cond errors lie within
    `PRECISION_SCALING` of each other (`_scales_with_roundoff`: an error that shrinks with the unit
    roundoff, as a log-space scan's ``u * sum |log a|`` does); otherwise ``kernel_bug`` stays. NaN/Inf in
    either run keep ``kernel_bug`` unless the float64 run is equivalent. The verdict itself is unchanged
    (the kernel does err beyond the bound in that dtype); the other run's verdict and cond_max are
    recorded (``float64_*`` / ``float32_*``). ``again``: that run's record where it was made already (the float64
    run of a half-precision case that checked an assumed chunk, `_judged_at_assumed_chunk`).
    """
    low = precision != "float64"
    other = "float64" if low else "float32"
    lost = None if low else range_lost(inputs, other)
    if lost is not None:  # the rerun would compare zeros (or infinities) with zeros: no evidence either way
        return "kernel_bug", Judgement(judgement.verdict, f"{judgement.why}; no second-dtype check: {lost}",
                                       judgement.rule)
    again = again or _rerun_in(other, spec, problem, inputs, options, kernel_fn, keep_output)
    record[f"{other}_verdict"] = again["verdict"]
    record[f"{other}_cond_max"] = again.get("cond_max")
    # the cond errors of the target that made the case divergent: a wrong final state beside a right output
    # is not an output error that scales with the roundoff
    target = "final_state_" if record.get("verdict_target") == "final_state" else ""
    whose = "the final state's " if target else ""
    if target:
        record[f"{other}_final_state_cond_max"] = again.get("final_state_cond_max")
        again = dict(again, cond_max=again.get("final_state_cond_max"))
    mine = {"verdict": judgement.verdict.value, "dtype": precision, "cond_max": record.get(f"{target}cond_max"),
            "n_kernel_nonfinite": record.get("n_kernel_nonfinite")}
    wide, narrow = (again, mine) if low else (mine, again)
    scales = roundoff_scaling(wide, narrow, rounded=not low, whose=whose)
    if low and again["verdict"] == Verdict.EQUIVALENT.value:
        found = f"the same inputs in float64 are equivalent (cond_max {again.get('cond_max'):.3g})"
    elif scales:
        found = scales
    elif again["verdict"] in ("out_of_domain", "kernel_error"):  # say the check could not be made, and why
        why = again.get("why") or again["verdict"]
        return "kernel_bug", Judgement(judgement.verdict, f"{judgement.why}; no second-dtype check: the same case in "
                                       f"{other} is {again['verdict']} ({why[:160]})", judgement.rule)
    else:
        return "kernel_bug", judgement
    ratio = None if target else record.get("baseline_ratio")  # the output's
    factor = (f"; it errs {ratio:.3g}x the {precision} sequential loop"
              if low and isinstance(ratio, float) and ratio == ratio else "")
    if low and record.get("n_kernel_nonfinite"):  # NaN/Inf where the oracle is finite and in range: a range loss
        factor = (f"; its NaN/Inf come from its own intermediates leaving {precision}'s range (an overflow of "
                  f"the form, not of the inputs: the exact state and output are in range)")
    elif low and again["verdict"] == Verdict.EQUIVALENT.value:
        caveat = _half_path_clause(problem, precision, ratio)
        if caveat:  # the searches line says it too: the cause's headline read "the algorithm is right" (hunt 26a)
            record["half_path_suspect"] = True
        factor += caveat
    why = f"{judgement.why}; precision loss: {found}{factor}"
    return "precision_loss", Judgement(judgement.verdict, why, judgement.rule)


#: A half-precision case equivalent in float64 that errs at least this many times the same-dtype loop (or has one
#: step) keeps ``precision_loss`` with `_half_path_clause` beside it.
HALF_PATH_RATIO = 100.0


def _half_path_clause(problem: Problem, precision: str, ratio: float | None) -> str:
    """The why's caveat where precision loss is the less likely reading: one step has almost nothing to round,
    and a correct form seldom errs `HALF_PATH_RATIO` times the same-dtype loop. A code path taken only for
    half-precision inputs reads the same, since the float64 run takes the other path; the cause cannot tell them
    apart and stays. Two blind hunts' half-only bugs at L = 1 (cond 962, 1.54e4 times the float16 loop; cond
    15.5, 247 times the bfloat16 loop) read as "the algorithm is right and loses digits" (session 25)."""
    one_step = problem.length <= 1
    far = isinstance(ratio, float) and ratio >= HALF_PATH_RATIO
    if not (one_step or far):
        return ""
    why = "one step has almost nothing to round" if one_step else f"{ratio:.3g}x the loop is more than rounding " \
                                                                   "usually loses"
    return (f"; but {why}: a code path taken only for {precision} inputs reads the same (the float64 run takes "
            "the other path), so check the kernel's dtype branches")


def range_lost(inputs: dict[str, torch.Tensor], dtype: str) -> str | None:
    """Why ``inputs`` rounded to ``dtype`` are not the case's inputs any more, or None: an input more than half
    of whose nonzero values underflow (to zero or below the smallest normal) or overflow there. A float64
    ``tiny`` case's inputs (about 1e-76) are all zero in float32, and the second-dtype rerun on them, zeros in
    and out, said nothing; the cause fell back to kernel_bug where the same kernel's ``trained`` cases were
    precision_loss (a blind hunt's log-space retention, session 24)."""
    info = torch.finfo(DTYPE_NAMES[dtype])
    for name, x in inputs.items():
        if not x.is_floating_point():
            continue
        x = x.detach().to("cpu", torch.float64)
        nonzero = (x != 0) & torch.isfinite(x)
        n = int(nonzero.sum())
        if not n:
            continue
        y = x[nonzero].abs()
        under, over = int((y < info.tiny).sum()), int((y > info.max).sum())
        if 2 * (under + over) > n:
            what = "underflow" if under >= over else "overflow"
            return (f"{name} rounded to {dtype} loses {under + over} of its {n} nonzero values ({what}: the case's "
                    f"inputs are out of {dtype}'s normal range, so its run there tells nothing)")
    return None


#: How much closer a float64 output must lie to the kernel's own float32 run (its inputs rounded to
#: float32) than to the oracle for `_undeclared_precision` to say it computes in float32: such a kernel
#: gives the same bits for both (it rounds its inputs first), a float64 kernel differs from its float32
#: run by the inputs' rounding, as much as a small mistake differs from the oracle.
SELF_AGREEMENT = 1e-3


def _undeclared_precision(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any],
                          baselines: dict[str, Any] | None, options: RunOptions, record: dict[str, Any],
                          float32_output: torch.Tensor) -> tuple[bool, str | None]:
    """Whether a divergent float64 output is float32's rounding: (named, the why's clause or None).

    A kernel that computes in float32 whatever its input (a fused kernel's float32 accumulators and
    log-decays, a ``.float()`` before the loop) errs about 5e8 times float64's bound on every float64 case,
    from the first step: not an algebraic mistake, and the second-dtype rerun does not say so (its float32
    run is equivalent, its float64 cond error 5e8 times larger). Two things together name it: the output
    judged at float32's bound is equivalent (``float32_bound_cond_max`` in the record), and the kernel's
    own float32 run on the inputs rounded to float32 (``float32_output``, the second-dtype rerun's, so the
    kernel is not called again) gives the same output (within `SELF_AGREEMENT` of its
    distance to the oracle; ``float32_run_distance``), with some output a normal float32 number. The first
    alone is not enough: a case whose float32 bound is wide (cancellation, tiny outputs) hides small
    mistakes of a float64 kernel (nine planted bugs of the ci calibration), and such a kernel's float32 run
    differs by its inputs' rounding; outputs that all underflow to 0 agree with any run. The cause is
    then ``undeclared_precision``; the verdict stays divergent: the kernel does not compute what a float64
    kernel must, and says nothing of it (`Capabilities.computes_in` declares it, and the case is then held
    to float32's rounding, as torchscale's float32 norm is). Within float32's bound but away from its own
    float32 run, the cause stays and the why says it (part of the kernel in float32, a decay table or a
    constant, looks like that; so does a small mistake)."""
    div, judgement = _judge_outputs(problem, outputs, traces, baselines, "float32", options)
    record["float32_bound_cond_max"] = div.cond_max
    if judgement.verdict is not Verdict.EQUIVALENT:
        return False, None
    out = outputs["output"].detach().to("cpu", torch.float64)
    exact = traces["output"].out.detach().to("cpu", torch.float64)
    if not bool((out[torch.isfinite(out) & torch.isfinite(exact)].abs() >= torch.finfo(torch.float32).tiny).any()):
        return False, None  # nothing float32 holds as a normal number: zeros agree with anything
    within = f"within float32's rounding bound (cond_max {div.cond_max:.3g} in float32's units)"
    partly = (f"{within}, but not its own float32 run on the inputs rounded to float32: part of it may compute in "
              "float32 (a decay table, a constant), or a mistake is that small")
    mine = float32_output.detach().to("cpu", torch.float64)
    both = torch.isfinite(out) & torch.isfinite(exact) & torch.isfinite(mine)
    if not bool(both.any()):
        return False, None
    to_oracle = float((out[both] - exact[both]).abs().max())
    to_own = record["float32_run_distance"] = float((out[both] - mine[both]).abs().max())
    if not to_own <= SELF_AGREEMENT * to_oracle:
        return False, partly
    return True, (f"undeclared precision: {within}, and {'the same bits as' if to_own == 0 else 'next to'} its own "
                  "float32 run on the inputs rounded to float32: the kernel computes in float32 whatever its input; "
                  "declare Capabilities(computes_in={'float64': 'float32'}) in a KernelSpec, or compute in float64")


#: The half-precision dtypes a float32 or float64 kernel may compute in without saying so (an autocast
#: region, a ``.to(torch.bfloat16)`` before the loop): `_half_precision_outputs` names one.
HALF_PRECISIONS = ("bfloat16", "float16")


def _half_numbers(actual: torch.Tensor, exact: torch.Tensor) -> list[str]:
    """The half precisions (`HALF_PRECISIONS`) whose numbers every finite element of ``actual`` is, with at
    least one of them a normal number of that dtype where the ``exact`` value is not one: the evidence that a
    float32 or float64 kernel rounded its result to that dtype (a float32 result is a bfloat16 number by chance
    with probability 2^-16, a float16 one with 1/8; small integers are every dtype's numbers, hence the exact
    values' test). Both half precisions can be named (bfloat16's 8 bits fit float16's 11 within its range)."""
    got64 = actual.detach().to("cpu", torch.float64)
    want64 = exact.detach().to("cpu", torch.float64)
    finite = torch.isfinite(got64) & torch.isfinite(want64)
    got, want = got64[finite], want64[finite]
    if got.numel() == 0:
        return []
    named = []
    for half in HALF_PRECISIONS:
        dtype = DTYPE_NAMES[half]
        if not bool((got.to(dtype).to(torch.float64) == got).all()):
            continue
        if bool(((want.to(dtype).to(torch.float64) != want) & (got.abs() >= torch.finfo(dtype).tiny)).any()):
            named.append(half)
    return named


def _half_judged(half: str, div: Any, judgement: Judgement) -> str | None:
    """How a result judged at ``half``'s bound fits a half-precision computation: within the bound, or out of
    that dtype's domain (a ``large`` case past float16's 65,504); None when it is beyond the bound."""
    if judgement.verdict is Verdict.EQUIVALENT:
        return f"within its rounding bound (cond_max {div.cond_max:.3g} in {half}'s units)"
    if judgement.verdict is Verdict.OUT_OF_DOMAIN:
        return f"out of its domain ({domain_kind(div)}: {judgement.why[:120]})"
    return None


def half_precision_clause(actual: torch.Tensor, exact: torch.Tensor,
                          judge_at: Callable[[str], tuple[Any, Judgement]], record: dict[str, Any], precision: str,
                          what: str = "output") -> str | None:
    """The why's clause of ``undeclared_precision`` when a divergent float32/float64 result ``actual`` is a
    half-precision computation's, else None: its elements are all one half precision's numbers
    (`_half_numbers`), and ``judge_at(half)`` (the result's (`Divergence`, `Judgement`) at that dtype's bound)
    finds it within the bound or out of that dtype's domain (`_half_judged`; ``<half>_bound_cond_max`` goes into
    ``record``). One definition for outputs (`_half_precision_outputs`) and gradients (`harness.gradients`)."""
    judged = []
    for half in _half_numbers(actual, exact):
        div, judgement = judge_at(half)
        record[f"{half}_bound_cond_max"] = div.cond_max
        fits = _half_judged(half, div, judgement)
        if fits is not None:
            judged.append((half, fits))
    if not judged:
        return None
    halves = " or ".join(half for half, _ in judged)
    how = "; ".join(f"judged as {half}, {fits}" for half, fits in judged)
    declare = " or ".join(f"Capabilities(computes_in={{'{precision}': '{half}'}})" for half, _ in judged)
    return (f"undeclared precision: every finite {what} is a {' and a '.join(h for h, _ in judged)} number (the "
            f"exact values are not); {how}: the kernel computes in {halves} whatever its input; declare {declare} "
            f"in a KernelSpec, or compute in {precision}")


def _half_precision_outputs(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any], options: RunOptions,
                            record: dict[str, Any], precision: str) -> str | None:
    """The why's clause when a divergent float32 or float64 output is a half-precision computation's, else None.

    A kernel that computes in bfloat16 whatever its input and casts its result back was ``kernel_bug`` from
    L = 1 (cond 1.3e4 in float32, 4.7e12 in float64: the output is b rounded to bfloat16), and its float64
    rerun diverges as much, so `_precision_counterfactual` cannot say it; under CPU autocast (bfloat16 matmuls
    for float32 inputs only) the float64 rerun is equivalent and it said ``precision_loss``, "the algorithm
    loses digits", of a parallel retention off 3e5 times the float32 loop at L = 1. Its outputs say it without
    a call (`half_precision_clause`); declared (`Capabilities.computes_in`), the case is judged at that bound."""
    return half_precision_clause(outputs["output"], traces["output"].out,
                                 lambda half: _judge_outputs(problem, outputs, traces, None, half, options),
                                 record, precision)


def _half_precision_hint(problem: Problem, outputs: dict[str, Any], traces: dict[str, Any], options: RunOptions,
                         record: dict[str, Any]) -> str | None:
    """The why's clause when a divergent float32/float64 output that is not all half-precision numbers lies well
    inside float16's rounding bound (cond_max at most `HALF_HINT_COND` in its units), else None; the cause stays.
    A state accumulated in float16 and read out in float32 was a bare kernel_bug (a blind hunt, session 24: cond
    0.05 in float16's units): its outputs are float32 numbers, so `_half_precision_outputs` cannot name it. Not
    bfloat16's bound: a retention decay one step off (3%) lies inside it (cond 0.26-0.34), as it does not in
    float16's."""
    exact = traces["output"].out
    if not float(exact.abs().nan_to_num(0.0, 0.0, 0.0).max()) >= torch.finfo(torch.float16).tiny:
        return None  # float16 holds no digit of these values; its bound is its absolute floor, not a measure (s. 28)
    div, judgement = _judge_outputs(problem, outputs, traces, None, "float16", options)
    if judgement.verdict is not Verdict.EQUIVALENT or not div.cond_max <= HALF_HINT_COND:
        return None
    return (f"well within float16's rounding bound (cond_max {div.cond_max:.3g} in float16's units): part of it may "
            "compute in float16 (an accumulator, a state, a decay table), or a mistake is that small")


#: How far inside float16's bound a float32/float64 output must lie for `_half_precision_hint` to name float16.
HALF_HINT_COND = 0.25


def _finish(record: dict[str, Any], judgement: Judgement, *, cause: str, timings: dict[str, float]) -> None:
    record["verdict"] = judgement.verdict.value
    record["rule"] = judgement.rule
    record["why"] = judgement.why
    record["cause"] = cause
    record.update({k: round(v, 6) for k, v in timings.items()})


def run_cases(cases: Iterable[tuple[KernelSpec, Problem]], options: RunOptions | None = None, *, store=None,
              progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every (kernel, problem) pair; each record is stored as soon as it is taken."""
    records = []
    for spec, problem in cases:
        rec = run_case(spec, problem, options, store=store)
        records.append(rec)
        if progress is not None:
            progress(rec)
    return records


def run_pair(spec_a: KernelSpec, spec_b: KernelSpec, problem: Problem, options: RunOptions | None = None, *,
             store=None) -> dict[str, Any]:
    """Differential mode: two kernels on the same inputs, with the oracle as referee.

    The record holds the error of A and of B against the float64 oracle (the same metrics as
    `run_case`) and the difference between A and B themselves, which is the question a user comparing
    two forms asks ("parallel and chunkwise disagree: which one is wrong, or is it the eps?").
    """
    options = options or RunOptions()
    kept_a: dict[str, torch.Tensor] = {}
    kept_b: dict[str, torch.Tensor] = {}
    rec_a = run_case(spec_a, problem, options, keep_output=kept_a)
    rec_b = run_case(spec_b, problem, options, keep_output=kept_b)
    outs = [kept_a.get("output") if rec_a["outcome"] == "ok" else None,
            kept_b.get("output") if rec_b["outcome"] == "ok" else None]
    record: dict[str, Any] = {"kernel": f"{spec_a.name} vs {spec_b.name}", "pair": [spec_a.name, spec_b.name],
                              "family": problem.family.value, "case": problem.key}
    record.update(problem.to_dict())
    record.pop("values", None)
    for tag, rec in (("a", rec_a), ("b", rec_b)):
        for key in ("verdict", "cause", "cond_max", "max_abs", "max_rel"):
            record[f"{tag}_{key}"] = rec.get(key)
    if outs[0] is not None and outs[1] is not None:
        diff = (outs[0] - outs[1]).abs()
        record["ab_max_abs"] = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
        scale = outs[1].abs().nan_to_num(nan=0.0).max().item() if diff.numel() else 0.0
        record["ab_max_rel"] = record["ab_max_abs"] / scale if scale > 0 else None
    from harness.records import severity

    record["verdict"] = max((rec_a["verdict"], rec_b["verdict"]), key=severity)
    record["why"] = f"A: {rec_a['why']} | B: {rec_b['why']}"
    record["cause"] = rec_a["cause"] if rec_a["verdict"] != "equivalent" else rec_b["cause"]
    record["replay"] = pair_replay_command(spec_a, spec_b, problem)
    if store is not None:  # the two kernels' own records are stored by the sweep's case list
        store.append(record)
    return record


def run_pairs(sweep, options: RunOptions | None = None, *, store=None) -> list[dict[str, Any]]:
    """Every pair of a sweep on every problem of its grids that both kernels can run."""
    return [run_pair(a, b, problem, options, store=store) for a, b, problem in sweep.pair_cases()]
