"""Gradients: a kernel's vector-Jacobian product against float64 autograd through the oracle.

For kernels that declare ``autograd``: the inputs (in the case's dtype) require grad, the kernel's
output is pulled back along a random cotangent (seeded from the problem, rounded to the dtype), and
each input's gradient is measured against float64 autograd through the oracle on the same rounded
inputs and cotangent (`reference_impls.autograd`: the oracles' definitions written out of place,
checked equal to them), through the same `metrics.measure` and `verdict.judge` as outputs.

Where a family's gradients are themselves instances of its oracle (retention's are retentions, the
normed retention's are retentions of the norm's pullback, the linear scan's are scans run backwards, the
gated families', the selective scan's and SSD's gated recurrences and sums of them: `FamilyDef.gradient_traces`),
each gradient is judged on that computation's own componentwise trace (`_adjoint_trace`), as an output is.
Elsewhere (a family without `gradient_traces`, SSD's packed rows in chunks) the bound is normwise: a gradient
element
is a sum of at most ``n`` terms, n the number of output elements (a parameter shared over time, batch
and channels, such as A, B or D, sums that many), and a recursive sum of n terms errs by at most about
``n u sum|terms|`` (Higham's gamma_n). The trace handed to `measure` has ``growth = n * s`` with
``s_i = max(max |reference gradient|, max|cotangent| * max m / |x_i|)`` (`natural_scale`), m the forward output's
conditioning companion (the sum of the absolute values of its terms, `Trace.magnitude`): the second
term is the natural size of the terms of dy/dx (each product term of y is linear in each input, so
``|x| |d term/dx| = |term|``), so that a gradient that is exactly zero by cancellation still has a
rounding scale. The same-dtype baseline (autograd through the same definitions run in the kernel's
dtype) decides, as for outputs, whether a larger error is rounding the plain loop makes too.

A case whose forward output is not equivalent is not differentiated: its forward record is returned
(the gradient of an overflowing or wrong forward says nothing new). A kernel whose output carries no
gradient (or, when it does not declare ``autograd``, whose forward refuses inputs that require grad) has
nothing to check and gives no gradient record; `harness check` relies on that to check the gradients of
every kernel, a user's own included, whose output is differentiable.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from harness import dtypes, families
from harness.kernels import isolation
from harness.kernels.contract import DTYPE_NAMES, Family, KernelSpec, RetentionConvention
from harness.kernels.guard import Outcome
from harness.problems import Problem
from harness.runner import (CONFIRMED_IN_FLOAT64, RunOptions, assumes_chunk, call_args, chunk_blocking, explains,
                            factor_clause, factor_gains, factors_to_try, half_precision_clause, inputs_in, named_inputs,
                            output_shape, reference_trace, rerun_options, run_case, runs_float64)
from harness.verdict import Verdict, domain_kind, judge
from reference_impls.trace import Trace

#: Inputs that are differentiated, per family (each family's ``grad_inputs``).
GRAD_INPUTS: dict[Family, tuple[str, ...]] = {Family.parse(n): families.get(n).grad_inputs for n in families.MODULES}


def _oracle_output(problem: Problem, x: dict[str, torch.Tensor], convention: RetentionConvention,
                   ) -> torch.Tensor:
    """The oracle's definition, differentiable (`reference_impls.autograd`), in the dtype of ``x``."""
    return problem.definition.differentiable(problem, x, convention)


class ForwardRaised(Exception):
    """The kernel's forward raised when its inputs required grad (it ran without them)."""

    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.original = exc


class InputWritten(Exception):
    """The kernel wrote into an input during `_vjp` (the message says which)."""


def _vjp(fn, inputs: dict[str, torch.Tensor], names: tuple[str, ...], cotangent: torch.Tensor,
         keep: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor | None] | None:
    """The gradients of ``fn`` along ``cotangent``; None when its output is not differentiable.
    ``keep``: receives the forward's output under ``"output"`` (detached)."""
    from harness.kernels.isolation import input_snapshots, written_input

    leaves = {k: v.detach().clone().requires_grad_(k in names) for k, v in inputs.items()}
    handed = input_snapshots((), leaves)
    with torch.enable_grad():
        try:
            out = fn(leaves)
        except Exception as exc:  # noqa: BLE001 - the caller decides what a failing forward means
            raise ForwardRaised(exc) from exc
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return None
        if keep is not None:
            keep["output"] = out.detach()
        wanted = [leaves[k] for k in names]
        grads = torch.autograd.grad(out, wanted, cotangent.to(out.dtype), allow_unused=True)
    written = written_input(handed, " in the forward and backward with inputs requiring grad")
    if written is not None:
        raise InputWritten(written)
    return dict(zip(names, grads))


def _kernel_vjp(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], names: tuple[str, ...],
                cot: torch.Tensor, options: RunOptions, keep: dict[str, torch.Tensor] | None = None,
                ) -> tuple[Outcome, Any, bool]:
    """The kernel's input gradients along ``cot``: ``(Outcome.OK, {name: grad} or None, False)``, None when
    the output carries no gradient, or ``(outcome, what happened, whether the forward itself failed)``.
    ``keep``: receives the output of that forward (inputs requiring grad) under ``"output"``.

    Forward and backward run where the forward ran (`RunOptions.worker_for`): in the kernel's worker
    process, whose crash or hang is then this record's, or in this process with ``--in-process``.
    """
    from harness.kernels import isolation

    worker, _ = options.worker_for(spec)
    if worker is None:
        fn = spec.callable()

        def kernel(x):
            args, kwargs = call_args(problem, x, spec)
            out = fn(*args, **kwargs)
            return out[0] if isinstance(out, (tuple, list)) and out else out  # (output, final state)

        try:
            return Outcome.OK, _vjp(kernel, inputs, names, cot, keep), False
        except InputWritten as exc:
            return Outcome.MUTATED_INPUT, str(exc), False
        except ForwardRaised as exc:
            return Outcome.RAISED, f"raised {exc}", True
        except Exception as exc:  # noqa: BLE001 - recorded by the caller
            return Outcome.RAISED, f"raised {type(exc).__name__}: {exc}", False
    args, kwargs = call_args(problem, inputs, spec)
    wanted = []
    for name in names:
        pos = next((i for i, a in enumerate(args) if a is inputs[name]), None)
        wanted.append(pos if pos is not None else next(k for k, v in kwargs.items() if v is inputs[name]))
    status, value, _ = isolation.run(worker, "vjp", args, kwargs, extra=(wanted, cot), timeout_s=options.timeout_s)
    if status == "ok":  # (the gradients, the forward's output)
        if keep is not None:
            keep["output"] = value[1]
        return Outcome.OK, dict(zip(names, value[0])), False
    if status == "not_differentiable":
        return Outcome.OK, None, False
    if status == "mutated_input":
        return Outcome.MUTATED_INPUT, value, False
    if status == "forward_raised":
        return Outcome.RAISED, f"raised {value}", True
    if status == "timeout":
        return Outcome.TIMEOUT, f"gave no result after {options.timeout_s:g} s", False
    if status == "crashed":
        return Outcome.CRASHED, f"crashed: {value}", False
    return Outcome.RAISED, f"raised {value}", False


#: Elementary operations behind one term of a gradient (products of up to four factors, exp, softplus,
#: silu, the norm's rsqrt and their derivatives), each rounded once.
GRAD_OPS = 8
#: The longest case whose gradients `harness.check` takes. The float64 autograd oracle
#: (`reference_impls.autograd`) keeps every step's state for its backward: about 1 GB per 1,024 steps at
#: 3 batch rows x 4 heads of 64 x 64 (retention and the gated families) and 10 s for the three gradients
#: at L = 1,024 (measured), so the nightly profile's L = 32,768 would ask for ~30 GB and minutes per
#: case and end the check for memory. Longer cases are checked forward only, and `check` counts them
#: (`CheckResult.gradients_skipped`). Every length of the ci profile (<= 2,048) is checked.
GRADIENT_MAX_LENGTH = 2048


def forward_judged(forward: dict[str, Any]) -> bool:
    """Whether a forward record lets its case's gradients be taken: ``equivalent`` only, the one rule `harness
    check`, `gradient_case` and the calibration follow (a forward partly out of domain was tried and withdrawn
    in session 22: docs/verdict.md)."""
    return forward.get("verdict") == "equivalent"


def gradients_checked(problem: Problem) -> bool:
    """Whether `harness.check` takes the gradients of ``problem`` (`GRADIENT_MAX_LENGTH`)."""
    return problem.length <= GRADIENT_MAX_LENGTH


#: Gradients have no a-priori conditioning companion; the normwise bound is widened by this factor.
#: Set from data: 30 derandomized cases per correct kernel and dtype (every autograd kernel available
#: here, L <= 128) gave, with a factor of 1, cond errors up to 5.4 (torchscale.chunkwise, float32) and
#: 2.0 (intree.retention_normed_chunkwise, float64), and a hypothesis search found 14.7 for the latter:
#: its 1/rms amplifies the rounding of its decay powers. 64 keeps a margin of 4 over the worst seen,
#: while a wrong adjoint (a relative error of order 1) stays ~1e9 times over the bound in float64.
GRADIENT_SLACK = 64.0


def natural_scale(cot_max: float, magnitude_max: float, x: torch.Tensor) -> torch.Tensor:
    """Per element of input ``x``: the size of the terms of the gradient with respect to it,
    ``max|cotangent| * max m / |x_i|`` (a product term t of y is linear in x_i, so ``|dt/dx_i| = |t| / |x_i|``).

    Per element, not over ``max|x|``: the terms of an element are large where that element is small (dv = 1,
    eps = 0: ``d sign(o)/dq_i`` is 0 through terms of size ``1/|q_i|``); dividing by ``max|x|`` called a
    correct normed kernel's exact 0 divergent against the oracle's -1e-16 (q = [1, 0, ..., 3e9]). An
    input of exactly 0 takes the smallest nonzero ``|x_j|`` instead (a finite scale; a floor relative to
    ``max|x|`` would again shrink the scale of the small elements beside a large one).
    """
    nonzero = x.abs()[x != 0]
    floor = float(nonzero.min()) if nonzero.numel() else 1.0
    return cot_max * magnitude_max / x.abs().clamp_min(floor)


def _gradient_trace(ref: torch.Tensor, n_terms: int, natural: torch.Tensor,
                    norm_peak: torch.Tensor | None = None) -> Trace:
    """A trace for a gradient: the normwise bound of a sum of ``n_terms`` terms (see the module doc), and the
    family's range domain of the backward where it has one (``norm_peak``: `Definition.gradient_norm_peak`).

    Its magnitude is the scale the bound is a multiple of, so a gradient has a precision domain as an
    output has: where the bound, ``u (n_terms + GRAD_OPS) GRADIENT_SLACK`` times that scale, reaches half
    of it, the check could not fail whatever the kernel gives (bfloat16 always, float16 past 8 terms,
    float32 past about 130,000): those elements are `precision_exhausted`, not compared, and a case made of
    them is out_of_domain. Without it (magnitude 0) a bfloat16 backward off by 84 times its value was
    `equivalent` at cond 0.003, against a bound 98 times the gradient's scale.
    """
    top = torch.maximum(natural.to(ref.dtype), ref.abs().max() if ref.numel() else torch.zeros((), dtype=ref.dtype))
    top = top.expand_as(ref)
    scale = top * float((n_terms + GRAD_OPS) * GRADIENT_SLACK)
    zero = torch.zeros_like(ref)
    return Trace(out=ref, magnitude=top, growth=scale, state_peak=zero, decay_peak=zero, norm_peak=norm_peak)


#: Headroom of a gradient judged on its own trace (`_adjoint_trace`) over the oracle's bound of the same
#: computation run forwards: a kernel's backward forms the same sums in another order (the adjoint of its
#: chunk decomposition, autograd through its parallel form) from intermediates its forward rounded once more.
#: Set from data (session 19, ci gradient calibration with third-party kernels, `--grad --seed 5`): at 1 the
#: correct kernels' gradients reach cond 0.42 (linear scan, 1,416 records in four dtypes) and 0.44 (retention);
#: 2 keeps a margin of about 5 for backward kernels not seen here, where a wrong adjoint is 1/u over.
ADJOINT_SLACK = 2.0


def _adjoint_trace(trace: Trace, ref: torch.Tensor) -> Trace:
    """A gradient's bound from the family's own trace of it (`FamilyDef.gradient_traces`): componentwise, as an
    output's, widened by `ADJOINT_SLACK`; its values are autograd's through the oracle (``ref``, the same
    numbers to float64 rounding)."""
    return dataclasses.replace(trace, out=ref, growth=trace.growth * ADJOINT_SLACK,
                               chunk_growth=None if trace.chunk_growth is None else trace.chunk_growth * ADJOINT_SLACK)


def _domain_kind(div: Any, ref: torch.Tensor, precision: str) -> str:
    """`verdict.domain_kind` of a gradient: a gradient has no state or decays, so elements that leave the
    range where every exact value is within the dtype's max and the norm's backward in range are within
    their bound of the max (``near_overflow``), not inputs that overflow."""
    kind = domain_kind(div)
    if kind != "input_overflow":
        return kind
    max_finite = dtypes.info(precision).max_finite
    norm = div.norm_peak_max
    in_range = bool(ref.numel() == 0 or float(ref.abs().max()) <= max_finite) and not norm > max_finite
    return "near_overflow" if in_range else kind


def cotangent(problem: Problem, shape: tuple[int, ...]) -> torch.Tensor:
    """The random output cotangent of ``problem``: seeded from it, float64, rounded to its dtype."""
    gen = torch.Generator().manual_seed(problem.seed + 7919)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(problem.torch_dtype).to(torch.float64)


def gradient_case(spec: KernelSpec, problem: Problem, options: RunOptions | None = None, *,
                  forward: dict[str, Any] | None = None,
                  inputs: dict[str, torch.Tensor] | None = None,
                  after_divergent: bool = False,
                  forward_output: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """One record per differentiated input (kernel ``<name>:grad[<input>]``), or the forward record
    when the forward output is not equivalent; none when the kernel's output is not differentiable.

    ``forward``: the forward record of this problem when it was already taken (`harness check`); it is
    then not run again, and not returned. ``inputs``: the case's inputs when they are not the problem's
    own draw (the float64 rerun of `_second_dtype`: a low-precision case's inputs, upcast exactly).
    ``after_divergent``: take the gradients after a divergent forward too (`_second_dtype` only: a log-space
    form's forward loses digits in the rerun's dtype as well, and its gradient's cause went unnamed).
    A divergent gradient is rerun in a second dtype to name its cause (`_second_dtype`).

    The output of the forward that ran with inputs requiring grad is judged too (`_training_forward`): a kernel
    may take another path there (a fused training kernel), and one wrong only on it passed. ``forward_output``:
    the plain forward's output (float64 on the CPU, `run_case`'s ``keep_output``), when kept; an output equal
    to it bit for bit needs no second judgement.
    """
    options = options or RunOptions()
    given = forward is not None
    if forward is None:
        kept: dict[str, torch.Tensor] = {}  # its output: a training forward equal to it needs no second judgement
        forward = run_case(spec, problem, options, inputs=inputs, keep_output=kept)
        forward_output = kept.get("output") if forward_output is None else forward_output
    if not (forward_judged(forward) or (after_divergent and forward.get("verdict") == "divergent")):
        return [] if given else [forward]
    inputs = problem.make_inputs() if inputs is None else inputs
    names = tuple(n for n in problem.definition.grad_inputs if n in inputs)
    g = cotangent(problem, output_shape(problem))
    precision = spec.capabilities.precision(problem.dtype)
    storage = dtypes.dtype_key(dtypes.torch_dtype(precision))  # a declared "tf32"/"tf32_rz" is float32 storage

    t0 = time.perf_counter()
    trained: dict[str, torch.Tensor] = {}
    outcome, got, forward_failed = _kernel_vjp(spec, problem, inputs, names,
                                               g.to(problem.torch_dtype).to(problem.device), options, trained)
    if outcome is not Outcome.OK:  # a failing backward is a finding, recorded
        if forward_failed and not spec.capabilities.autograd:
            return []  # an undeclared kernel that cannot take inputs requiring grad: not differentiable
        what = (named_inputs(problem, got) if outcome is Outcome.MUTATED_INPUT
                else f"forward with inputs requiring grad {got}" if forward_failed else f"backward {got}")
        message = f"{outcome.value}: {what}"
        record = dict(forward, mode="grad", grad_of="*", outcome=outcome.value, error=message,
                      kernel=f"{spec.name}:grad[*]", replay=_replay_gradient(forward.get("replay"), "*"))
        judgement = judge({}, options.policy, kernel_error=message)
        record.update(verdict=judgement.verdict.value, why=judgement.why, cause=outcome.value)
        return [record]
    t_kernel = time.perf_counter() - t0
    if got is None:
        return []  # the output carries no gradient (a kernel without autograd): nothing to check
    training = None  # judged first: it names a training path's wrong forward before its gradients
    if "output" in trained:
        isolation.raise_if_stopped()
        training = _training_forward(spec, problem, inputs, trained["output"], forward, forward_output, options)
    x64 = {k: v.detach().to("cpu", torch.float64) for k, v in inputs.items()}
    isolation.raise_if_stopped()  # each of the oracle's backward passes below takes seconds at nightly lengths
    want = _vjp(lambda x: _oracle_output(problem, x, spec.convention), x64, names, g)
    peaks: list[dict[str, torch.Tensor]] = []  # the backward's range domain, formed at the first divergent gradient
    base = None
    if storage != "float64":
        low = {k: v.to(DTYPE_NAMES[storage]) for k, v in x64.items()}
        isolation.raise_if_stopped()
        base = _vjp(lambda x: _oracle_output(problem, x, spec.convention), low, names,
                    g.to(DTYPE_NAMES[storage]))
    # on the chunks the kernel's decays span (mamba-ssm's SSD reference: the whole sequence), as its forward
    isolation.raise_if_stopped()
    adjoint = problem.definition.gradient_traces(chunk_blocking(spec, problem), x64, g, names, spec.convention) or {}
    alternatives = problem.definition.gradient_alternatives(problem, x64, want)
    records: list[dict[str, Any]] = []
    bound_of: dict[str, Any] = {}
    y_scale = None  # the forward's magnitude, for a normwise bound only
    for name in names:
        ref = want[name]
        actual = got[name]
        if ref is None:
            continue
        missing = actual is None
        if missing:
            actual = torch.zeros_like(inputs[name])  # the kernel ignores an input the oracle depends on
        if name in alternatives:  # at a kink of the definition, the one-sided derivative the kernel is nearer
            near = actual.detach().to("cpu", torch.float64)
            other = alternatives[name]
            ref = torch.where((near - other).abs() < (near - ref).abs(), other, ref)
        axis = problem.definition.input_length_axis(name)
        if adjoint.get(name) is not None:
            bound_of[name] = _adjoint_trace(adjoint[name], ref.detach())
        else:
            if y_scale is None:
                y_scale = float(reference_trace(problem, x64, spec.convention).magnitude.max())
            natural = natural_scale(float(g.abs().max()), y_scale, x64[name])
            bound_of[name] = _gradient_trace(ref.detach(), g.numel(), natural)

        def judged(norm_peak: torch.Tensor | None):
            trace = bound_of[name] if norm_peak is None else dataclasses.replace(bound_of[name], norm_peak=norm_peak)
            div = _measured(problem, name, actual, trace, None if base is None else base[name], precision, options,
                            adjoint=name in adjoint)
            return div, judge(div, options.policy)

        div, judgement = judged(None)
        if judgement.verdict is Verdict.DIVERGENT:
            # the norm's backward past the range is not held against a kernel (`gradient_norm_peak`), but a
            # kernel right there too is judged on every element: excused only where it fails, and only if that
            # explains the failure (as the forward's `loop_nonfinite` excuses a NaN the plain loop makes too)
            peaks = peaks or [problem.definition.gradient_norm_peak(problem, x64, names, spec.convention) or {}]
            if peaks[0].get(name) is not None:
                ranged, its_judgement = judged(peaks[0][name])
                if its_judgement.verdict is not Verdict.DIVERGENT:
                    div, judgement = ranged, its_judgement
        record = _case_fields(forward)
        _record_measurement(record, div, axis)
        record.update(mode="grad", grad_of=name, verdict=judgement.verdict.value, why=judgement.why,
                      replay=_replay_gradient(forward.get("replay"), name),
                      cause={"equivalent": "rounding", "divergent": "kernel_bug"}.get(judgement.verdict.value)
                      or _domain_kind(div, ref, precision),
                      kernel=f"{spec.name}:grad[{name}]", t_kernel=round(t_kernel, 6))
        if missing and judgement.verdict is Verdict.DIVERGENT:  # not a numerical slip: said so (blind hunt, session 23)
            record["why"] = (f"{record['why']}; the kernel's backward gave no gradient for {name} (None, taken as "
                             "zeros): its output depends on it")
        records.append(record)
    if assumes_chunk(spec, problem, options) and any(r["verdict"] == "divergent" for r in records):
        confirm = None
        if precision in CONFIRMED_IN_FLOAT64:
            def confirm() -> dict[str, dict[str, Any]] | None:  # the same inputs' gradients in float64, chunks assumed
                if not runs_float64(spec, problem, options):
                    return None
                taken = gradient_case(spec, problem.replace(dtype="float64", tf32=False),
                                      dataclasses.replace(rerun_options(options), chunk_counterfactual=True),
                                      inputs=inputs_in("float64", inputs), after_divergent=True)
                return {r["grad_of"]: r for r in taken if r.get("mode") == "grad"}

        _assumed_chunk(problem, records, got, bound_of, base, x64, g, precision, options, spec.convention, confirm)
    if options.precision_counterfactual and any(r["verdict"] == "divergent" for r in records):
        _second_dtype(spec, problem, options, inputs, records, precision)
    if options.precision_counterfactual and precision in ("float64", "float32"):
        for record in records:
            if record["verdict"] == "divergent" and record["cause"] in ("kernel_bug", "precision_loss"):
                name = record["grad_of"]
                _half_precision(record, got[name], bound_of[name], precision, options)
    if options.factor_counterfactual:
        for record in records:
            if record["verdict"] == "divergent" and record["cause"] == "kernel_bug":
                name = record["grad_of"]
                low = None if base is None or base[name] is None else base[name].detach()
                _constant_factor(problem, record, got[name], bound_of[name], low, precision, options, spec.convention)
    return ([] if training is None else [training]) + records


#: Fields of a forward record that are its measurement, not the case's description: a gradient record (or the
#: training forward's) starts from the forward's record without them (a final state's cond copied into every
#: gradient row had the table show it as their worst); the chunk the forward was judged at
#: (`runner._judged_at_assumed_chunk`) is the forward's, and a gradient says its own.
_FORWARD_MEASUREMENT_PREFIXES = ("t_", "cond", "max_", "ulp", "worst", "final_state_", "verdict_target",
                                 "assumed_chunk", "unchunked_", "chunked_", "sequence_cond")


def _case_fields(forward: dict[str, Any]) -> dict[str, Any]:
    """The forward record's description of the case (`_FORWARD_MEASUREMENT_PREFIXES` left out)."""
    return {k: v for k, v in forward.items() if not k.startswith(_FORWARD_MEASUREMENT_PREFIXES)}


def _training_forward(spec: KernelSpec, problem: Problem, inputs: dict[str, torch.Tensor], output: torch.Tensor,
                      forward: dict[str, Any], forward_output: torch.Tensor | None, options: RunOptions,
                      ) -> dict[str, Any] | None:
    """The record of the forward that ran with inputs requiring grad, where it is not what the plain forward's
    judgement said (a kernel that takes another path in training: a fused forward saving its intermediates, an
    `autograd.Function`); None where it is the plain forward's output bit for bit, or is judged equivalent (or
    cannot be judged). Before, a kernel whose forward was wrong only there passed (a blind hunt, session 27).

    Its cause is ``kernel_bug``, or ``precision_loss`` where the same forward with grad in float64 is equivalent.
    """
    from harness.kernels.guard import _contract
    from harness.kernels.isolation import same_bits
    from harness.runner import judged_output

    if forward_output is not None and same_bits(output.detach().to("cpu", torch.float64), forward_output):
        return None
    record = _case_fields(forward)
    record.update(mode="grad", grad_of="*", kernel=f"{spec.name}:grad[*]", outcome="ok", training_forward=True,
                  replay=_replay_gradient(forward.get("replay"), "*"))
    what = "the forward with inputs requiring grad (the path a training step takes)"
    broken = _contract(output, output_shape(problem), problem.torch_dtype, torch.device(problem.device))
    if broken is not None:
        message = f"{broken[0].value}: {what} {broken[1]}"
        judgement = judge({}, options.policy, kernel_error=message)
        record.update(outcome=broken[0].value, error=message, verdict=judgement.verdict.value, why=judgement.why,
                      cause=broken[0].value)
        return record
    precision = spec.capabilities.precision(problem.dtype)
    taken: list[dict[str, Any] | None] = []  # that path in float64, taken once when first needed

    def in_float64() -> dict[str, Any] | None:
        """The same path's output in float64 on the same inputs, judged as `judged_output` judges (chunk sizes
        assumed as here): its verdict and cond_max; None where it cannot be taken."""
        if not taken:
            taken.append(None)
            if options.precision_counterfactual and precision != "float64" and runs_float64(spec, problem, options):
                wide = problem.replace(dtype="float64", tf32=False)
                wide_inputs = inputs_in("float64", inputs)
                names = tuple(n for n in problem.definition.grad_inputs if n in wide_inputs)
                kept: dict[str, torch.Tensor] = {}
                wide_options = dataclasses.replace(rerun_options(options), chunk_counterfactual=True)
                outcome, _, _ = _kernel_vjp(spec, wide, wide_inputs, names, cotangent(wide, output_shape(wide)),
                                            wide_options, kept)
                if outcome is Outcome.OK and "output" in kept:
                    wide_div, wide_judgement = judged_output(spec, wide, wide_inputs, kept["output"], wide_options)
                    taken[0] = {"verdict": wide_judgement.verdict.value, "cond_max": wide_div.cond_max}
        return taken[0]

    div, judgement = judged_output(spec, problem, inputs, output, options, confirm=in_float64)
    if judgement.verdict is not Verdict.DIVERGENT:
        return None
    wide_run = in_float64() if precision != "float64" else None
    cause = "precision_loss" if wide_run is not None and wide_run["verdict"] == "equivalent" else "kernel_bug"
    record.update({k: v for k, v in div.to_dict().items() if k not in ("dtype", "length")})
    record.update(verdict=judgement.verdict.value, cause=cause,
                  why=f"{what}: {judgement.why}; without grad the same case's forward is {forward.get('verdict')}"
                      + ("; in float64 that path is equivalent: precision lost in this dtype"
                         if cause == "precision_loss" else ""))
    return record


def _measured(problem: Problem, name: str, actual: torch.Tensor, trace: Trace, baseline: torch.Tensor | None,
              precision: str, options: RunOptions, *, adjoint: bool) -> Any:
    """The `Divergence` of input ``name``'s gradient ``actual`` against ``trace`` (its bound), ``baseline`` the
    same-dtype loop's gradient; ``adjoint``: the bound is the family's own trace of the gradient (its function room
    then applies)."""
    from harness.metrics import measure

    axis = problem.definition.input_length_axis(name)
    out_shape = tuple(problem.definition.output_shape(problem))
    return measure(actual.detach(), trace, function_room=problem.function_room if adjoint else 0.0,
                   dtype=precision, tf32=problem.tf32, baseline=None if baseline is None else baseline.detach(),
                   length_axis=-1 if axis is None else axis, cond_threshold=options.policy.cond_threshold,
                   element_axes_names=_axis_names(actual, axis, out_shape,
                                                  problem.definition.input_axes(problem, name)))


def _record_measurement(record: dict[str, Any], div: Any, axis: int | None) -> None:
    """A gradient's measurement into its record (the case's dtype and length are the forward's)."""
    from harness.metrics import NO_POSITIONS

    record.update({k: v for k, v in div.to_dict().items() if k not in ("dtype", "length")})
    if axis is None:  # no sequence axis: the measurement's positions are along the input's last axis
        record.update(NO_POSITIONS)


def _assumed_chunk(problem: Problem, records: list[dict[str, Any]], got: dict[str, torch.Tensor | None],
                   bound_of: dict[str, Trace], base: dict[str, torch.Tensor | None] | None,
                   x64: dict[str, torch.Tensor], cot: torch.Tensor, precision: str, options: RunOptions,
                   convention: RetentionConvention,
                   confirm: "Callable[[], dict[str, dict[str, Any]] | None] | None" = None) -> None:
    """Judge a divergent gradient of a kernel that declares no chunk size as `runner._judged_at_assumed_chunk` judges
    an output: on its adjoint's trace at each of `runner.assumed_chunk_sizes` (a chunked backward forms its decays
    from its forward's chunk sums; one oracle run per size for every pending gradient, no kernel call), smallest
    first; at the first where it is not divergent, that measurement and verdict are the record's, with
    ``assumed_chunk_size``, ``unchunked_cond_max`` and the note in the why (a correct chunked selective scan without
    a chunk_size parameter has its float64 dB and dC past the loop's bound). Where none
    holds, ``chunked_cond_max`` is the cond error at the largest and the record stays. In half precision ``confirm``
    gives the same inputs' gradients in float64, chunks assumed there too (None: it cannot): the assumption holds
    only for a gradient equivalent there, as for an output (`runner._judged_at_assumed_chunk`)."""
    from harness.runner import assumed_chunk_clause, assumed_chunk_sizes, assumption_refused

    wide: list[dict[str, dict[str, Any]] | None] = []  # the float64 gradients, taken once when first needed

    pending = [r for r in records if r["verdict"] == "divergent" and r["cause"] == "kernel_bug"
               and got.get(r["grad_of"]) is not None]
    for chunk in assumed_chunk_sizes(problem.length):
        if not pending:
            return
        traces = problem.definition.gradient_traces(problem.replace(chunk_size=chunk), x64, cot,
                                                    tuple(r["grad_of"] for r in pending), convention) or {}
        for record in list(pending):
            name = record["grad_of"]
            if traces.get(name) is None:  # no adjoint trace of this gradient: its bound has no chunk term
                pending.remove(record)
                continue
            ref = bound_of[name].out
            div = _measured(problem, name, got[name], _adjoint_trace(traces[name], ref),
                            None if base is None else base[name], precision, options, adjoint=True)
            judgement = judge(div, options.policy)
            record["chunked_cond_max"] = div.cond_max
            if judgement.verdict not in (Verdict.EQUIVALENT, Verdict.OUT_OF_DOMAIN):
                continue
            pending.remove(record)
            if confirm is not None:
                wide = wide or [confirm()]
                refused = assumption_refused(None if wide[0] is None else wide[0].get(name))
                if refused is not None:
                    record["why"] = (f"{record['why']}; within a chunked form's bound at chunk {chunk} (cond_max "
                                     f"{div.cond_max:.3g}), but {refused}")
                    continue
            unchunked = record.get("cond_max")
            del record["chunked_cond_max"]
            _record_measurement(record, div, problem.definition.input_length_axis(name))
            record.update(verdict=judgement.verdict.value, assumed_chunk_size=chunk, unchunked_cond_max=unchunked,
                          cause="rounding" if judgement.verdict is Verdict.EQUIVALENT
                          else _domain_kind(div, ref, precision),
                          why=f"{judgement.why}; {assumed_chunk_clause(chunk, unchunked)}")


def _axis_names(grad: torch.Tensor, axis: int | None, out_shape: tuple[int, ...],
                declared: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
    """The names of a gradient's axes in its record: the family's for that input (``declared``,
    `FamilyDef.input_axes`); the output's (None: `measure`'s default) for an input laid out as the output
    (retention's q, k, v; a scan's u); else ``batch`` and ``t`` where the input has them and the axis number
    elsewhere."""
    if declared is not None and len(declared) == grad.ndim:
        return declared
    if axis is not None and tuple(grad.shape) == out_shape:
        return None
    t = None if axis is None else axis % grad.ndim
    return tuple("t" if i == t else "batch" if i == 0 and t is not None else f"axis{i}" for i in range(grad.ndim))


def _replay_gradient(forward_replay: str | None, name: str) -> str | None:
    """The forward's replay command, made to take the gradient of input ``name`` (`harness replay --grad-of`)."""
    import shlex

    return None if not forward_replay else f"{forward_replay} --grad-of {shlex.quote(name)}"


def _constant_factor(problem: Problem, record: dict[str, Any], actual: torch.Tensor | None, bound: Trace,
                     baseline: torch.Tensor | None, precision: str, options: RunOptions,
                     convention: RetentionConvention) -> None:
    """Name a divergent gradient that is the exact one times a constant (a backward on another scale, a
    flipped sign) as `runner._constant_factor` names an output: judged again against the exact gradient
    times each factor `runner.factors_to_try` gives (the trace's scale and the same-dtype gradient with it);
    explained at one, the cause is ``constant_factor``. The verdict is unchanged."""
    from harness.metrics import measure

    if actual is None:
        return
    for factor, meaning in factors_to_try(problem, actual, bound.out, precision, convention):
        low = None if baseline is None else (baseline.to(torch.float64) * factor).to(baseline.dtype)
        div = measure(actual.detach(), bound.scaled(factor), dtype=precision, tf32=problem.tf32, baseline=low, length_axis=-1,
                      cond_threshold=options.policy.cond_threshold)
        record["constant_factor"], record["constant_factor_cond_max"] = factor, div.cond_max
        if explains(judge(div, options.policy)) and factor_gains(record.get("cond_max"), div.cond_max):
            record["cause"] = "constant_factor"
            record["why"] = f"{record['why']}; {factor_clause('gradient', factor, div.cond_max, meaning)}"
            return


def _half_precision(record: dict[str, Any], actual: torch.Tensor | None, bound: Trace, precision: str,
                    options: RunOptions) -> None:
    """Name a divergent float32/float64 gradient that a half-precision computation gives, as an output is
    named (`runner.half_precision_clause`), judged at that dtype's bound. The cause is then
    ``undeclared_precision``; the verdict is unchanged."""
    from harness.metrics import measure

    def judge_at(half: str):
        div = measure(actual.detach(), bound, dtype=half, tf32=False,
                      baseline=None, length_axis=-1, cond_threshold=options.policy.cond_threshold)
        return div, judge(div, options.policy)

    clause = None if actual is None else half_precision_clause(actual, bound.out, judge_at, record, precision,
                                                              "gradient element")
    if clause is not None:
        record["cause"] = "undeclared_precision"
        record["why"] = f"{record['why']}; {clause}"


def _second_dtype(spec: KernelSpec, problem: Problem, options: RunOptions, inputs: dict[str, torch.Tensor],
                  records: list[dict[str, Any]], precision: str) -> None:
    """Name the cause of a divergent gradient as `runner._precision_counterfactual` does for outputs: a
    low-precision case reruns in float64 on the same rounded inputs (upcast exactly), a float64 case in float32
    on its inputs rounded to float32. ``precision_loss`` where that input's gradient is equivalent in float64
    (a Blelloch tree's adjoint through products of decays that overflow in float32 where the exact gradient is
    finite), or where the two cond errors lie within `runner.PRECISION_SCALING` of each other, both finite: an
    error that shrinks with the unit roundoff, as a log-space scan's gradient through its cumulative sums of
    logs does (a blind hunt's correct Heinsen scan: db divergent at cond 1.6 in float64, called kernel_bug).
    Otherwise, or where the kernel does not run the other dtype here, ``kernel_bug`` stays. The verdict is
    unchanged; the other run's verdict and cond_max are recorded (``float64_*`` / ``float32_*``)."""
    from harness.runner import roundoff_scaling

    low = precision != "float64"
    other = "float64" if low else "float32"
    if spec.capabilities.runs(other, problem.device) is not None:
        return
    taken = gradient_case(spec, problem.replace(dtype=other, tf32=False), rerun_options(options),
                          inputs=inputs_in(other, inputs), after_divergent=True)
    again = {r.get("grad_of"): r for r in taken}
    for record in records:
        if record["verdict"] != "divergent":
            continue
        there = again.get(record["grad_of"])
        record[f"{other}_verdict"] = None if there is None else there["verdict"]
        record[f"{other}_cond_max"] = None if there is None else there.get("cond_max")
        if there is None or there.get("mode") != "grad":  # say the check could not be made, and why
            forward = next((r for r in taken if r.get("mode") != "grad"), None)
            if forward is not None:
                record["why"] = (f"{record['why']}; no second-dtype check: the same case's forward in {other} is "
                                 f"{forward['verdict']} ({str(forward.get('why') or forward['verdict'])[:160]})")
            continue
        wide, narrow = (there, record) if low else (record, there)
        if low and there["verdict"] == "equivalent":
            found = f"the same inputs in float64 give an equivalent gradient (cond_max {there.get('cond_max'):.3g})"
        else:
            found = roundoff_scaling(wide, dict(narrow, dtype=narrow.get("dtype", other)), rounded=not low)
            if found is None:
                continue
        record["cause"] = "precision_loss"
        record["why"] = f"{record['why']}; precision loss: {found}"
