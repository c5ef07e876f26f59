"""`check`: drive one kernel over property-based cases from Python (and `harness check`).

Hypothesis draws problems inside the kernel's capabilities and the profile's limits, climbs towards
the worst inputs with `hypothesis.target` on the condition-normalized error, and shrinks a failure to
a minimal case, which is saved in the caller's project (`harness.project`: its counterexamples folder,
``.harness/counterexamples/`` by default) or in ``counterexample_dir``. Every case run is appended to the
store as it is measured. `harness check`, the ``harness_check`` pytest fixture and this repository's own
suite (tests/test_kernel_suite.py) all run this one search.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any, Callable, Iterable, Sequence

from harness.errors import DivergenceError, InvalidArgument
from harness.kernels.contract import ALL_DTYPES, Capabilities, Family, KernelSpec

#: Verdicts that fail a check; out_of_domain is a finding about the inputs, not the kernel.
from harness.signatures import capabilities_from_signature  # noqa: E402
from harness.records import FAILING_VERDICTS  # noqa: E402 - one definition, re-exported here

#: Seconds the shrink phase may take after the first failure (hypothesis's own limit is 300 s per
#: shrink, and a nightly case of L=8192 spent more than five minutes there). Past it, failures seen
#: before replay and every new example passes at once, so hypothesis ends with the smallest failing case
#: found so far, which `check` reports (``CheckResult.shrink_stopped``).
SHRINK_DEADLINE_S: float = 120.0


def user_kernel_spec(target: "str | Callable | KernelSpec", *, family: Family | str | None,
                     name: str | None = None, capabilities: Capabilities | None = None) -> KernelSpec:
    """A `KernelSpec` for a user kernel: a callable, a ``module:attr`` / ``file.py:attr`` target, or a spec."""
    from harness.kernels import registry
    from harness.kernels.registry import resolve_target

    if isinstance(target, str) and ":" not in target and target in {s.name for s in registry.all_kernels()}:
        spec = registry.get(target)  # a registered kernel by name, with its declared capabilities
        if family is not None and Family.parse(family) is not spec.family:
            raise InvalidArgument(f"family={family!r}: kernel {target!r} is registered in family "
                                  f"{spec.family.value!r}; leave --family out or give that one")
        return spec
    if isinstance(target, str):
        from harness.kernels.isolation import probe_target
        from harness.kernels.target import canonical_target

        target = canonical_target(target)  # one name however the path was typed, from wherever
        probe_target(target, None if family is None else Family.parse(family).value)  # its import, in a worker
    obj = resolve_target(target) if isinstance(target, str) else target
    if isinstance(obj, KernelSpec):
        if family is not None and Family.parse(family) is not obj.family:
            raise InvalidArgument(f"family={family!r}: kernel {target!r} is a KernelSpec of family "
                                  f"{obj.family.value!r}; leave --family out or give that one")
        if isinstance(target, str):  # named by its target: keyed, replayed and loaded in a worker by it
            return replace(obj, name=f"user.{target}", source="user")
        return obj
    if family is None:
        raise InvalidArgument(f"family=None: a plain callable ({target!r}) needs --family; "
                              f"expected one of {[f.value for f in Family]}")
    if not callable(obj):
        raise InvalidArgument(f"kernel={target!r} is a {type(obj).__name__}, which is not callable")
    if name is None and not isinstance(target, str):
        # a function of the script being run: named (and loaded) by its file; of an importable module: by its
        # module (two functions named `scan` shared one name, and a replay command that could not find either)
        target = _script_target(obj) or _module_target(obj) or target
    label = name or (target if isinstance(target, str) else getattr(obj, "__qualname__", "kernel"))
    notes: list[str] = []
    if capabilities is None:  # undeclared: what its signature says it takes (harness.signatures)
        capabilities, notes = capabilities_from_signature(obj, family)
    return KernelSpec(name=f"user.{label}" if not str(label).startswith("user.") else str(label),
                      family=Family.parse(family), load=lambda: obj,
                      capabilities=replace(capabilities, notes="; ".join(notes)) if notes else capabilities,
                      source="user")


@dataclass
class CheckResult:
    """What `check` found: every record taken, and the shrunk failure if there was one."""

    records: list[dict[str, Any]] = field(default_factory=list)
    failure: dict[str, Any] | None = None
    counterexample: Path | None = None
    message: str | None = None
    shrink_stopped: bool = False  # the shrink deadline ended shrinking: ``failure`` is the best so far
    #: Equivalent forward cases too long for their gradients to be taken (`harness.gradients.GRADIENT_MAX_LENGTH`).
    gradients_skipped: int = 0
    #: Cases of a differentiable kernel whose forward is out_of_domain: no digit of the output is guaranteed (or
    #: the inputs leave the dtype's range), so its gradient is not judged either; counted so that a search that
    #: spends its gradients' budget there says so.
    gradients_out_of_domain: int = 0
    #: Cases of a user kernel whose output carried no gradient (detached, computed under ``no_grad``, or a kernel
    #: without autograd): nothing to differentiate; counted so that `harness check` says its gradients were not
    #: checked (a blind hunt's kernel that detached its output passed with no word of it).
    gradients_not_differentiable: int = 0
    #: The input regimes the search draws from (`harness.strategies.searched_regimes`): the searches line says
    #: which of them no case drew (a blind hunt's 20-example searches passed a kernel with no dt clamp that never
    #: met ``negative_steps``, session 23).
    regimes: tuple[str, ...] = ()
    #: The options of the family's signature that no case passed: the kernel's signature hides whether it takes them
    #: (``*args`` / ``**kwargs``; `Capabilities.untested_options`). `harness check` names them under its searches.
    untested_options: tuple[str, ...] = ()
    #: The saved counterexamples of this kernel (of the dtypes searched) that no longer fail on replay, found after a
    #: search that passed (`harness.cases.stale_counterexamples`); `harness check` names them and `harness prune`.
    stale_counterexamples: tuple[Path, ...] = ()

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def _script_target(fn: Callable) -> str | None:
    """``path/to/script.py:qualname`` for a module-level function of the script run as ``__main__`` (``python
    script.py``), else None. A worker cannot find such a function under ``__main__`` (it does not run the
    caller's script), so the worker loads the script by its file, as a module of another name: its
    ``if __name__ == "__main__":`` block does not run there (`harness.kernels.isolation.refuse_in_worker`
    stops an unguarded ``harness.check`` with that advice). Relative to the working directory when inside it."""
    import sys

    if getattr(fn, "__module__", None) != "__main__" or "<" in getattr(fn, "__qualname__", "<"):
        return None
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not str(path).endswith(".py") or not Path(path).is_file():
        return None
    resolved = Path(path).resolve()
    try:
        shown = resolved.relative_to(Path.cwd())
    except ValueError:
        shown = resolved
    return f"{shown}:{fn.__qualname__}"


def _module_target(fn: Callable) -> str | None:
    """``package.module:qualname`` for a module-level function of a module other than ``__main__`` that is found
    under that name (what `harness replay --kernel` and a worker load it by), else None (a lambda, a closure, a
    method, an object made at run time)."""
    import sys

    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or module == "__main__" or not isinstance(qualname, str) or "<" in qualname or "." in qualname:
        return None
    return f"{module}:{qualname}" if getattr(sys.modules.get(module), qualname, None) is fn else None


def dtype_names(dtypes: "str | torch.dtype | Iterable[str | torch.dtype] | None") -> "tuple[str, ...] | None":
    """``dtypes`` as names: one name or a comma-separated list (``"float32"``, ``"float32,bfloat16"``), a
    ``torch.dtype``, or an iterable of either; None stays None. Unknown names are left for
    `validate_limits` to refuse (a string is never read as its letters)."""
    import torch

    if dtypes is None:
        return None
    if isinstance(dtypes, (str, torch.dtype)):
        dtypes = (dtypes,)
    if not isinstance(dtypes, Iterable):
        raise InvalidArgument(f"dtypes={dtypes!r} is a {type(dtypes).__name__}; expected a dtype name, a "
                              "comma-separated list of them, a torch.dtype or an iterable of either")
    names: list[str] = []
    for d in dtypes:
        if isinstance(d, torch.dtype):
            names.append(str(d).removeprefix("torch."))
        elif isinstance(d, str):
            names.extend(part.strip() for part in d.split(","))
        else:
            raise InvalidArgument(f"dtypes contains {d!r}, a {type(d).__name__}; expected dtype names such as "
                                  f"'float32' (or torch dtypes)")
    return tuple(dict.fromkeys(names))  # a dtype named twice is one search, not two


def _policy_argument(policy):
    """``policy`` as a `Policy`: one already, None (the defaults), the CLI's spec string (``"cond=4,baseline=3"``)
    or a mapping of its keys; anything else is an `InvalidArgument` naming it."""
    from collections.abc import Mapping

    from harness.verdict import Policy

    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return Policy.parse(policy)
    if isinstance(policy, Mapping):
        return Policy.parse(",".join(f"{k}={v}" for k, v in policy.items()))
    raise InvalidArgument(f"policy={policy!r} is a {type(policy).__name__}; expected a harness.verdict.Policy, a spec "
                          "such as 'cond=4,baseline=3', a mapping of those keys, or None")


def validate_limits(*, max_examples: int | None = None, max_length: int | None = None,
                    dtypes: "tuple[str, ...] | None" = None, device: str | None = None) -> None:
    """Raise `InvalidArgument` for a limit that would otherwise mean something else silently.

    ``None`` means "the profile's default"; 0, a negative number or an empty dtype list is an error (it
    never means the default, nor "run nothing").
    """
    for name, value in (("max_examples", max_examples), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidArgument(f"{name}={value!r} must be a whole number >= 1; leave it out for the profile's "
                                  "default")
    if device is not None:
        if not isinstance(device, str) or not (device in ("cpu", "cuda") or device.startswith("cuda:")
                                                and device[5:].isdigit()):
            raise InvalidArgument(f"device={device!r} must be 'cpu' or 'cuda[:n]'")
        if device != "cpu":
            import torch

            if not torch.cuda.is_available():
                raise InvalidArgument(f"device={device!r} but this machine has no CUDA device (torch.cuda.is_available() "
                                      f"is False, torch {torch.__version__}); check on 'cpu'")
            if ":" in device and int(device[5:]) >= torch.cuda.device_count():
                raise InvalidArgument(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA "
                                      f"device(s), numbered from 0")
    if dtypes is not None:
        if not dtypes or any(not d for d in dtypes):
            raise InvalidArgument(f"dtypes={list(dtypes)!r} names no dtype; expected a non-empty subset of "
                                  f"{list(ALL_DTYPES)}, or leave it out for every dtype the kernel declares")
        bad = [d for d in dtypes if d not in ALL_DTYPES]
        if bad:
            raise InvalidArgument(f"dtypes={list(dtypes)!r} contains {bad}; expected a subset of {list(ALL_DTYPES)}")


class _StopSearch(BaseException):
    """Ends the hypothesis search at once (a `BaseException`, which hypothesis neither shrinks nor replays).

    Raised after a ``timeout``: each further attempt would cost the full timeout, and shrinking a hang
    finds no smaller bug; the timed-out case is recorded once and saved as it was drawn. Also when the worker
    could not load the kernel (`isolation.LOAD_FAILED`): every case would fail the same way.
    """


def _without_directory(name: str | None) -> str | None:
    """A file target ``DIR/FILE.py:ATTR`` (or a kernel name holding one) as ``FILE.py:ATTR``: where a
    checkout lies (a CI runner's work directory, a pytest tmp_path) must not change what is drawn."""
    if name is None:
        return None
    path, sep, attr = name.rpartition(":")
    return f"{PurePath(path).name}:{attr}" if sep and path.endswith(".py") else name


def database_key(spec: KernelSpec, target: str | None) -> bytes:
    """The example-database key of ``check`` on one kernel: its own, so that checking kernel B after A
    does not replay A's failure first (one nested search function would give every kernel one key).

    A kernel from a file is keyed by the file's name, not its directory (`_without_directory`), so a
    derandomized search draws the same cases in every clone of the kernel's repository.
    """
    import hashlib

    name, target = _without_directory(spec.name), _without_directory(target)
    return hashlib.sha384(f"harness.check:{name}:{target}:{spec.family.value}".encode()).digest()


def derandomized_seed(spec: KernelSpec, target: str | None, dtypes: "tuple[str, ...] | None" = None) -> int:
    """The seed of a derandomized (ci profile) search on one kernel: a hash of the kernel and its family,
    and of the dtype when the search is over one (`harness check` runs one per dtype).

    Hypothesis would otherwise seed a derandomized run from the source text of the search function, so
    an edit to `check` (or a comment in it) changed every draw of the ci profile and with it which
    planted bugs the suite found; with this seed the draws depend on the kernel and the profile only.
    Searches of one dtype each seeded alike drew the same shapes in every dtype: a kernel's group-map bug
    that needs 2 groups of 2 channels was in none of its four ci searches, where seeding each dtype apart
    gives four searches four sets of shapes.
    """
    import hashlib

    key = database_key(spec, target)
    if dtypes is not None and len(dtypes) == 1:
        key = hashlib.sha384(key + f":{dtypes[0]}".encode()).digest()
    return int.from_bytes(key[:8], "big")


def key_search(search: Callable, spec: KernelSpec, target: str | None, profile: str | None = None,
               dtypes: "tuple[str, ...] | None" = None) -> None:
    """Give a hypothesis search on ``spec`` its own example-database key and, in a derandomized profile
    (ci), draws seeded from the kernel (`derandomized_seed`): `check` and the suite's own searches alike."""
    from hypothesis import settings

    from harness.settings import active_profile

    search._hypothesis_internal_database_key = database_key(spec, target)
    if settings.get_profile(profile or active_profile()).derandomize:
        search._hypothesis_internal_use_seed = derandomized_seed(spec, target, dtypes)


def search_phases(profile: str) -> tuple:
    """The hypothesis phases of `check`'s search: the profile's, without ``explain``.

    After shrinking, hypothesis's explain phase re-runs the test on up to 500 variations of the shrunk case
    to annotate its own printout of the failing example ("or any other generated value"). `check` reports
    its own record of the shrunk case instead (the verdict, its cause and the counterfactuals), so every
    kernel call of that phase was spent for nothing: 9 of a failing search's 15 s on a planted bug, whose
    records then filled the report with cases that only varied the shrunk one.
    """
    from hypothesis import Phase, settings

    return tuple(phase for phase in settings.get_profile(profile).phases if phase is not Phase.explain)


def check(fn: "Callable | str | KernelSpec", *, family: Family | str | None = None, profile: str | None = None,
          dtypes: tuple[str, ...] | None = None, device: str = "cpu", max_length: int | None = None,
          max_examples: int | None = None, policy=None, store=None, counterexample_dir: Path | None = None,
          save_counterexample: bool = True, check_determinism: bool = True, grad: bool = True,
          shrink_deadline_s: float | None = SHRINK_DEADLINE_S, timeout_s: "float | None | type(...)" = ...,
          isolation: str | None = None) -> CheckResult:
    """Run the property-based search on one kernel; never raises for what the kernel does.

    One search over ``dtypes`` (all the kernel runs, when None) with the profile's examples, drawn where its
    cond_max target leads: `harness check` calls this once per dtype so that each gets the profile's
    examples; pass one dtype per call for the same. A failure's counterexample file is per kernel, family
    and dtype (`harness.cases.counterexample_path`).

    ``grad``: also check, for each case whose forward is equivalent (`gradients.forward_judged`), the gradient
    of every differentiable
    input against float64 autograd through the oracle (`harness.gradients`), when the kernel's output is
    differentiable (a user's kernel is tried; a registered one follows its ``autograd`` declaration). The
    forward and each input's gradient are separate records (kernel ``<name>:grad[<input>]``).
    ``shrink_deadline_s`` bounds the time spent shrinking after the first failure (None: hypothesis's
    own limits only); see `SHRINK_DEADLINE_S`.
    ``timeout_s`` (seconds per call) and ``isolation`` (``"process"`` or ``"in-process"``) default to the
    session's (`harness.kernels.isolation.configure`). A case that fails is recorded once: hypothesis's
    replays of it (shrinking, the final report) reuse its record instead of calling the kernel again, so
    a kernel whose output varies from call to call gets the ``nondeterministic`` outcome, never a
    hypothesis ``Flaky`` error; a case that times out ends the search (`_StopSearch`).
    """
    import time

    from hypothesis import Phase, given, settings, target as hyp_target
    from hypothesis.errors import Flaky

    from harness.cases import counterexample_path
    from harness.gradients import gradient_case
    from harness.kernels import isolation as _isolation
    from harness.runner import RunOptions, run_case as _run_case
    from harness.settings import (PROFILES, active_profile, limits, register_profiles, without_local_constants,
                                  without_seed_advice)
    from harness.strategies import problems
    from harness.verdict import Policy

    _isolation.refuse_in_worker("harness.check")
    register_profiles()
    if profile is not None and profile not in PROFILES:
        raise InvalidArgument(f"profile={profile!r} is not a profile; expected one of {list(PROFILES)}")
    dtypes = dtype_names(dtypes)
    validate_limits(max_examples=max_examples, max_length=max_length, dtypes=dtypes, device=device)
    if shrink_deadline_s is not None and (isinstance(shrink_deadline_s, bool)
                                          or not isinstance(shrink_deadline_s, (int, float)) or not shrink_deadline_s >= 0):
        raise InvalidArgument(f"shrink_deadline_s={shrink_deadline_s!r} must be a number >= 0 or None (no deadline)")
    policy = _policy_argument(policy)
    if store is not None and not callable(getattr(store, "append", None)):
        raise InvalidArgument(f"store={store!r} is a {type(store).__name__}; expected a harness.store.RunStore (or "
                              "any object with an append(record) method) or None")
    spec = user_kernel_spec(fn, family=family)
    reason = spec.unavailable_reason()
    if reason:
        raise InvalidArgument(f"kernel {spec.name!r} is unavailable here: {reason}")
    profile = profile or active_profile()
    lim = limits(profile)
    options = RunOptions(policy=policy or Policy(), check_determinism=check_determinism,
                         timeout_s=_isolation.default_timeout(lim.timeout_s) if timeout_s is ... else
                         _isolation.validate_timeout(timeout_s),
                         isolation=_isolation.validate_isolation(isolation or _isolation.default_isolation()))
    from harness.strategies import searched_regimes

    result = CheckResult(regimes=tuple(searched_regimes(spec)), untested_options=spec.capabilities.untested_options)
    slow = spec.capabilities.slow  # interpreted (Triton on the CPU): the profile's few, short cases
    examples = max_examples or (lim.slow_max_examples if slow else lim.max_examples)
    if max_length is None and slow:
        max_length = lim.slow_max_length
    # a file target as the kernel is named (`canonical_target`): its saved case replays from any folder
    target = _isolation.user_target(spec) or (fn if isinstance(fn, str) else None)

    def where(record: dict[str, Any]) -> Path | None:  # the failing case's file: one per kernel, family and dtype
        if not save_counterexample:
            return None
        kernel = record["kernel"] if record.get("mode") == "grad" else spec.name  # a gradient's case: its own file
        return counterexample_path(kernel, spec.family.value, directory=counterexample_dir, kernel_target=target,
                                   dtype=record.get("dtype"))
    failed: dict[str, dict[str, Any]] = {}  # problem key -> its failing record (hypothesis replays failures)
    problem_of: dict[str, Any] = {}
    first_failure: list = []  # when the first failure was seen (the shrink phase starts there), and its kind

    run_case = _with_gradients(_run_case, gradient_case, spec, result, store) if grad else _run_case

    def fail(record: dict[str, Any]):
        result.failure = record
        path = where(record)
        replay = f"harness replay {path}" if path is not None else record["replay"]
        if path is not None and target is not None:
            import shlex

            replay = f"harness replay {shlex.quote(str(path))} --kernel {shlex.quote(target)}"
        context: list[str] = []
        named = named_on_larger_cases(record, result.records)
        if named:
            context.append(named)
        problem = problem_of.get(record.get("case"))
        if problem is not None:
            context += call_context(record, problem)
        message = failure_message(record, options.policy, replay=replay, context=context)
        error = DivergenceError(message)
        error.record = record
        return error

    phases = search_phases(profile)
    targeting = Phase.target in phases  # the draws follow the kernel's own errors (`harness.settings.CI_PHASES`)

    @settings(settings.get_profile(profile), max_examples=examples, phases=phases)
    @given(problems(spec, dtypes=dtypes, device=device, max_length=max_length, profile=profile))
    def search(problem):
        key = problem.key
        record = failed.get(key)
        if record is None:
            if (first_failure and shrink_deadline_s is not None
                    and time.monotonic() - first_failure[0] > shrink_deadline_s):
                # past the shrink deadline: a failure seen before fails again (hypothesis replays its
                # best), anything new passes without running, so shrinking ends at once
                result.shrink_stopped = True
                return
            record = run_case(spec, problem, options, store=store)
            result.records.append(record)
            cond = record.get("cond_max")
            if targeting and isinstance(cond, (int, float)) and cond == cond and cond != float("inf"):
                hyp_target(float(cond), label="cond_max")  # not in ci: hypothesis steers by it even unphased
            if record["verdict"] in FAILING_VERDICTS:
                failed[key], problem_of[key] = record, problem
                first_failure[:] = first_failure or [time.monotonic(), record.get("cause") in ROUNDING_CAUSES]
                if record.get("outcome") == "timeout" or str(record.get("error") or "").startswith(
                        _isolation.LOAD_FAILED):
                    result.failure = record
                    raise _StopSearch()
        if record["verdict"] in FAILING_VERDICTS:
            # hypothesis tells failures apart by where they are raised: a divergence that the algorithm's
            # rounding explains is raised apart, so that shrinking one kind cannot end on a smaller case of
            # the other (a group-map bug of a chunk form shrank to its precision_loss, and the bug's own
            # case was never saved); each is shrunk on its own, and the kind found first is reported
            if record.get("cause") in ROUNDING_CAUSES:
                raise fail(record)
            raise fail(record)

    key_search(search, spec, target, profile, dtypes)
    try:
        # the draws follow the seed, not the literals of the caller's code; no "add @seed to this test"
        with without_local_constants(), without_seed_advice():
            search()
        result.failure = None
    except (DivergenceError, ExceptionGroup) as exc:
        exc, others = _reported(exc, first_failure[1] if len(first_failure) > 1 else False)
        result.failure = getattr(exc, "record", result.failure)
        result.message = str(exc) + "".join(
            f"\nThe search also failed as {_outcome_line(r)} (shrunk on its own; replay: {r.get('replay')})"
            f"{_same_narrow_range(result.failure, r)}" for r in others)
        if result.shrink_stopped:
            result.message += (f"\nShrinking stopped at the {shrink_deadline_s:g} s deadline: this is the smallest "
                               "failing case found by then.")
    except _StopSearch:
        result.message = str(fail(result.failure)) + (
            "\n(The search stopped at this case: a kernel its worker cannot load fails every case alike.)"
            if result.failure.get("outcome") != "timeout" else
            "\n(The search stopped at this case: a call that does not return within the timeout is not "
            "shrunk or re-run; --timeout SECONDS sets the limit.)")
    except Flaky as exc:  # a failure that did not repeat although the record cache replays it: say so
        record = dict(result.failure or (result.records[-1] if result.records else {}))
        record.update(outcome="nondeterministic", verdict="kernel_error", cause="nondeterministic",
                      error=f"hypothesis saw this kernel fail and then pass on the same inputs ({type(exc).__name__})")
        result.failure = record
        result.message = str(fail(record))
    if result.failure is not None and save_counterexample:
        problem = problem_of.get(result.failure.get("case"))
        if problem is not None:
            _save_found_case(result, problem, counterexample_dir, target)
    if result.failure is None and save_counterexample:  # the kernel's saved cases that a fix left behind
        from harness.cases import stale_counterexamples

        result.stale_counterexamples = tuple(stale_counterexamples(spec, directory=counterexample_dir, dtypes=dtypes,
                                                                   device=device, options=options))
    return result


def assumed_chunk_note(records: Iterable[dict[str, Any]]) -> str | None:
    """The searches line's note on the cases (and gradients) judged at an assumed chunk size (`runner.
    _judged_at_assumed_chunk`: a gated or selective-scan kernel that declares none), or None where there are none."""
    import collections

    assumed = [r for r in records if r.get("assumed_chunk_size") is not None]
    if not assumed:
        return None
    grads = sum(1 for r in assumed if r.get("mode") == "grad")
    cases = len(assumed) - grads
    what = " and ".join(f"{n} {noun}{'' if n == 1 else 's'}" for n, noun in ((cases, "case"), (grads, "gradient")) if n)
    sizes = collections.Counter(r["assumed_chunk_size"] for r in assumed)
    each = ", ".join(f"chunk {chunk}: {n}" for chunk, n in sorted(sizes.items()))
    return f"{what} judged at an assumed chunk size ({each}; it declares none: declare it to be judged at its own)"


def untested_options_line(kernel: str, result: CheckResult) -> str | None:
    """`harness check`'s line naming the options no case of ``kernel``'s search passed (`CheckResult.untested_options`),
    or None where every option of the family's signature was tested or the kernel says it takes none."""
    if not result.untested_options:
        return None
    return (f"{kernel}: options not tested: {', '.join(result.untested_options)} (its signature hides whether it "
            "takes them behind *args / **kwargs; name them in its signature, an nn.Module's forward, or declare its "
            "Capabilities in a KernelSpec)")


def dtype_searches(fn: "Callable | str | KernelSpec", *, family: Family | str | None = None,
                   dtypes: "tuple[str, ...] | None" = None, device: str = "cpu") -> "list[tuple[str, ...] | None]":
    """The dtypes of each search a kernel gets: one search per dtype it runs on ``device`` (of ``dtypes`` if
    given), in the order given or declared, each with the profile's examples; where none runs, one search of
    ``dtypes`` as given (it says why, a usage error). One search over every dtype spent its 25 ci cases as
    its draws fell (a user's selective scan: float32 14, float64 8, bfloat16 2, float16 1): a bug of the dtype
    that got one case was seen by chance. `harness check` and the pytest fixture search so
    (`check_each_dtype`), and so draw the same cases: a check's baseline gates a pytest run and back."""
    caps = user_kernel_spec(fn, family=family).capabilities
    dtypes = dtype_names(dtypes)
    return [(d,) for d in (dtypes or caps.dtypes) if caps.runs(d, device) is None] or [dtypes]


def check_each_dtype(fn: "Callable | str | KernelSpec", *, family: Family | str | None = None,
                     dtypes: "tuple[str, ...] | None" = None, device: str = "cpu", **options: Any) -> CheckResult:
    """`check` once per search of `dtype_searches`, joined into one result: every record, the first failure
    (its message followed by the other searches' failures), the counts summed."""
    results = [check(fn, family=family, dtypes=each, device=device, **options)
               for each in dtype_searches(fn, family=family, dtypes=dtypes, device=device)]
    if len(results) == 1:
        return results[0]
    failed = [r for r in results if not r.passed]
    first = failed[0] if failed else results[0]
    joined = CheckResult(records=[rec for r in results for rec in r.records], failure=first.failure,
                         counterexample=first.counterexample, regimes=first.regimes,
                         untested_options=first.untested_options,
                         shrink_stopped=any(r.shrink_stopped for r in results),
                         stale_counterexamples=tuple(p for r in results for p in r.stale_counterexamples))
    joined.message = "\n\n".join(r.message for r in failed if r.message) or None
    for count in ("gradients_skipped", "gradients_out_of_domain", "gradients_not_differentiable"):
        setattr(joined, count, sum(getattr(r, count) for r in results))
    return joined


def _save_found_case(result: CheckResult, problem, directory: Path | None, target: str | None) -> None:
    """Save ``result``'s counterexample (`harness.cases.save_counterexample`); a folder that cannot be
    written (read-only, full) leaves the failure's message whole, with a line saying the case was not saved,
    why, and the command that replays it without the file: the failure is the search's finding, the file a
    copy of it (a read-only ``--cases-dir`` once lost the message, the searches lines and the report)."""
    from harness import cases

    try:
        result.counterexample = cases.save_counterexample(result.failure, problem, directory=directory,
                                                          kernel_target=target)
    except OSError as exc:
        where = exc.filename or directory
        # its Replay line named the file that was not written (a blind hunt, session 27): the command without it
        lines = [f"Replay: {result.failure.get('replay')}" if line.startswith("Replay: harness replay ") else line
                 for line in (result.message or "").splitlines()]
        result.message = "\n".join(lines) + (
            f"\n\nThe counterexample could not be saved ({where}: {exc.strerror or exc}); replay it with:\n"
            f"  {result.failure.get('replay')}")


#: Causes of a divergence that the algorithm's rounding explains (the float64 rerun, a second dtype, TF32 or
#: a chunk bound): a search raises them apart from a mistake, so that each kind is shrunk on its own.
ROUNDING_CAUSES = ("precision_loss", "chunk_rounding", "tf32", "undeclared_precision")


def _reported(exc: BaseException, first_rounding: bool) -> tuple[BaseException, list[dict[str, Any]]]:
    """The failure a search reports, and the records of its other distinct failures: of a hypothesis
    exception group (one per place a failure was raised), the one of the kind the search found first
    (``first_rounding``: its cause was a rounding cause), shrunk. The first find is what the search was led
    to; a kernel that computes in float16 is best named by its undeclared_precision, a group-map mistake by
    its kernel_bug, though a chunk form's precision loss beside it shrinks further."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc, []
    errors = [e for e in exc.exceptions if isinstance(e, DivergenceError)]
    if not errors:
        raise exc
    errors.sort(key=lambda e: (getattr(e, "record", {}).get("cause") in ROUNDING_CAUSES) != first_rounding)
    return errors[0], [e.record for e in errors[1:] if hasattr(e, "record")]


def _same_narrow_range(reported: dict[str, Any] | None, other: dict[str, Any]) -> str:
    """A note on another failure of a search whose reported one is ``undeclared_precision``: a kernel that
    computes in a narrower dtype over- or underflows that dtype's range on the ``tiny`` and ``large`` regimes'
    inputs, a plain ``kernel_bug`` there that the same declaration mends (blind hunt, session 23: read as a second
    bug)."""
    if (reported or {}).get("cause") != "undeclared_precision" or other.get("cause") != "kernel_bug" \
            or other.get("regime") not in ("tiny", "large"):
        return ""
    return (f" -- regime {other.get('regime')}: likely the same narrower dtype's range (declare computes_in and "
            "search again)")


def _outcome_line(record: dict[str, Any]) -> str:
    return f"{record.get('verdict')}, {record.get('cause')} ({record.get('dtype')} L={record.get('length')})"


#: Causes that say no more than "wrong" (a shrunk case often has too few elements to name more).
_UNNAMED_CAUSES = (None, "kernel_bug", "rounding")


def larger_cases_cause(record: dict[str, Any], records: list[dict[str, Any]]) -> str | None:
    """The cause that failing cases of the same search were named where the shrunk ``record`` is a bare
    ``kernel_bug``, e.g. ``constant_factor``, which needs 16 elements and so is rarely named on a minimal case
    (a kernel off by a factor 1.01 shrinks to one element); None otherwise.

    The cause is the one named on the search's largest failing case(s): a wrong decay is one constant
    factor on a one-step float16 case of one head, now and then, while its 1,056-element case names
    nothing (found on a user's SSD kernel: "constant_factor (1 of the search's 6)" misled)."""
    if record.get("cause") != "kernel_bug":
        return None
    cause = _on_largest_failures(record, records, "cause")
    return None if cause in _UNNAMED_CAUSES else cause


#: Causes that name a convention (a scale, a layout) where a bug can look like one on a case small enough.
_CONVENTION_CAUSES = ("constant_factor", "layout")


def larger_cases_unnamed(record: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """Whether the shrunk ``record`` names a convention (`_CONVENTION_CAUSES`) while the search's largest failing
    cases were a bare ``kernel_bug``: a chunk form that leaves its last, partial chunk unscaled shrank below one
    chunk, where the whole output is that chunk and reads "the scale= passed was ignored", while every larger case
    was a kernel_bug from the partial chunk's first step (blind hunt 26a)."""
    return (record.get("cause") in _CONVENTION_CAUSES
            and _on_largest_failures(record, records, "cause") == "kernel_bug")


def larger_cases_slip(record: dict[str, Any], records: list[dict[str, Any]]) -> str | None:
    """The slip (`harness.runner._named_slip`) that the search's largest failing cases were named where the shrunk
    ``record`` is a ``kernel_bug`` with none: a half-precision case of one element is not tried, and a selective scan
    that adds its bias after the softplus shrank to one bfloat16 element while 6 of its 7 largest cases named it."""
    if record.get("cause") != "kernel_bug" or record.get("slip"):
        return None
    return _on_largest_failures(record, records, "slip")


def _on_largest_failures(record: dict[str, Any], records: list[dict[str, Any]], key: str) -> Any:
    """The most common ``key`` of the largest failing cases of ``record``'s search."""
    import collections

    same = _same_failures(record, records)
    if not same:
        return None
    largest = max(r.get("n_elements") or 0 for r in same)
    top = collections.Counter(r.get(key) for r in same if (r.get("n_elements") or 0) == largest)
    return top.most_common(1)[0][0]


def _same_failures(record: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kernel") == record.get("kernel") and r.get("verdict") == record.get("verdict")
            and r.get("mode") == record.get("mode")]


def larger_cases_chunk_onset(record: dict[str, Any], records: list[dict[str, Any]]) -> str | None:
    """A line for a shrunk ``kernel_bug`` whose search's failing cases of more than one chunk (two at least) all
    first mismatch at a chunk's first step after the first: at the last, partial chunk's (a slip in the tail chunk)
    or at the chunk boundaries (the state carried into a chunk); None otherwise. A chunk form that left its partial
    tail chunk unscaled shrank to one step in float16, where nothing showed that every larger case had started at
    t = floor(L / C) * C (blind hunt 26a)."""
    from harness.verdict import chunk_position

    if record.get("cause") != "kernel_bug":
        return None
    multi = [r for r in _same_failures(record, records)
             if isinstance(r.get("chunk_size"), int) and isinstance(r.get("length"), int)
             and isinstance(r.get("onset_t"), int) and 0 < r["chunk_size"] < r["length"]]
    where = [chunk_position(r["onset_t"], r["length"], r["chunk_size"]) for r in multi]
    if len(multi) < 2 or not all(where) or any(r["onset_t"] == 0 for r in multi):
        return None
    tail = all("partial" in w for w in where)
    example = max(multi, key=lambda r: r.get("n_elements") or 0)
    return (f"Larger cases: all {len(multi)} of the search's {record.get('verdict')} cases of more than one chunk first "
            f"mismatch at {'the first step of their last, partial chunk' if tail else 'a chunk boundary'} (e.g. "
            f"{example.get('dtype')} L={example.get('length')} chunk_size {example.get('chunk_size')}: t="
            f"{example.get('onset_t')}): "
            + ("a slip in the tail chunk, where L is not a multiple of chunk_size" if tail
               else "a slip at the chunk boundaries, in the state carried into a chunk"))


def named_on_larger_cases(record: dict[str, Any], records: list[dict[str, Any]]) -> str | None:
    """A line for a failure message: `larger_cases_cause` with how many cases were so named and an example."""
    from harness.verdict import chunk_position

    same = _same_failures(record, records)
    if larger_cases_unnamed(record, records):
        bugs = [r for r in same if r.get("cause") == "kernel_bug"]
        example = max(bugs, key=lambda r: r.get("n_elements") or 0)
        chunk = example.get("chunk_size")
        onset = example.get("onset_t")
        return (f"Larger cases: kernel_bug ({len(bugs)} of the search's {len(same)} {record.get('verdict')} cases; "
                f"e.g. {example.get('dtype')} L={example.get('length')}"
                + (f" chunk_size {chunk}" if chunk else "")
                + (f", first mismatch at t={onset}{chunk_position(onset, example.get('length'), chunk)}"
                   if onset is not None else "")
                + f"): this case's {record.get('cause')} may be how the bug looks on a case this small; "
                "replay the larger case (its record in the report) to see where it starts")
    cause = larger_cases_cause(record, records)
    slip = None if cause is not None else larger_cases_slip(record, records)
    if cause is None and slip is None:
        return larger_cases_chunk_onset(record, records)
    named = [r for r in same if (r.get("cause") == cause if slip is None else r.get("slip") == slip)]
    n = len(named)
    example = max(named, key=lambda r: r.get("n_elements") or 0)
    clause = str(example.get("why") or "").rsplit("; ", 1)[-1]
    clause = clause.removeprefix("slip: ") if slip else clause
    clause = clause if len(clause) <= 300 else clause[:297] + "..."
    return (f"Named on larger cases: {cause or 'slip'} ({n} of the search's {len(same)} {record.get('verdict')} cases; "
            f"e.g. {example.get('dtype')} L={example.get('length')} {example.get('regime')}: {clause})")


def _with_gradients(run_case: Callable, gradient_case: Callable, spec: KernelSpec, result: CheckResult, store,
                    ) -> Callable:
    """``run_case`` followed, when the forward is judged (`forward_judged`) and the output differentiable, by the gradient
    records of the case (stored and kept in ``result``); returns the first failing record, else the forward. Every
    gradient taken is kept: the ones after a failing one were dropped, and a report called a case's wrong db
    equivalent beside its wrong da (a blind hunt, session 24: 29 records of db, 48 of da)."""

    from harness.gradients import forward_judged, gradients_checked

    def run(spec_, problem, options, *, store=None):
        differentiable = spec.source == "user" or spec.capabilities.autograd
        kept: dict[str, Any] = {}  # the plain forward's output: a training forward equal to it is not judged again
        record = run_case(spec_, problem, options, store=store,
                          **({"keep_output": kept} if differentiable and gradients_checked(problem) else {}))
        if not differentiable:
            return record
        if not forward_judged(record):
            if record["verdict"] == "out_of_domain":
                result.gradients_out_of_domain += 1
            return record
        if not gradients_checked(problem):
            result.gradients_skipped += 1
            return record
        taken = [record]
        grads = gradient_case(spec_, problem, options, forward=record, forward_output=kept.get("output"))
        if not grads:
            result.gradients_not_differentiable += 1
        for grad_record in grads:
            if store is not None:
                store.append(grad_record)
            taken.append(grad_record)
        last = next((r for r in taken[1:] if r["verdict"] in FAILING_VERDICTS), record)
        result.records.extend(r for r in taken if r is not last)
        return last

    return run


def failure_message(record: dict[str, Any], policy, *, replay: str | None = None,
                    context: Sequence[str] = ()) -> str:
    """The message of a failing case's ``record`` (`harness.verdict.format_failure`: worst element with ACTUAL and
    DESIRED, bound, onset, the baseline loop, ``context`` lines and the ``replay`` line), judged under ``policy``
    with the record's own verdict and why. One definition for `check`'s failure and `harness replay`, which
    printed only a few fields of the case `check` had explained (a blind hunt, session 24)."""
    from harness.verdict import Judgement, Verdict, format_failure, judge

    judgement = judge(record, policy)
    if judgement.verdict.value != record["verdict"]:  # a second target (the final state) judged the case
        judgement = Judgement(Verdict(record["verdict"]), record["why"], "final_state")
    elif record.get("why"):  # the run's why: it carries the counterfactuals (eps, float64, future leak)
        judgement = Judgement(judgement.verdict, record["why"], judgement.rule)
    return _naming_gradients(format_failure)(record, judgement, replay=replay, context=context)


def call_context(record: dict[str, Any], problem) -> list[str]:
    """The failure message's lines about what the kernel was handed (grouped B and C, a chunk size, a state), not
    only the output: ``Call: ...``, and for a kernel_error the family's ``Hint: ...`` on its contract."""
    hint = problem.definition.contract_hint(problem) if record.get("verdict") == "kernel_error" else None
    return [f"Call: {problem.describe_call()}"] + ([f"Hint: {hint}"] if hint else [])


def _naming_gradients(format_failure: Callable) -> Callable:
    def with_gradient_note(record, judgement, replay=None, context=()) -> str:
        if not (isinstance(record, dict) and record.get("mode") == "grad"):
            return format_failure(record, judgement, replay=replay, context=context)
        # in place of the forward's headline ("Kernel output diverges ..."), which read as a contradiction under
        # "the forward is equivalent" (blind hunt, session 23)
        kernel = str(record["kernel"]).rsplit(":grad[", 1)[0]
        verdict, of = record.get("verdict"), record.get("grad_of")
        if record.get("training_forward"):  # `gradients._training_forward`
            return format_failure(record, judgement, replay=replay, context=context,
                                  headline=f"The forward of {kernel} with inputs requiring grad (the path a training "
                                           f"step takes) is {verdict}; without grad it is equivalent, and the replay "
                                           "command takes that forward again.")
        what = (f"The backward of {kernel} is {verdict}" if of in (None, "*") else
                f"The gradient of {kernel}'s output with respect to {of} is {verdict} against the float64 "
                "oracle's (autograd through the oracle)")
        return format_failure(record, judgement, replay=replay, context=context,
                              headline=f"{what}; the forward is equivalent, and the replay command takes that "
                                       "gradient again.")

    return with_gradient_note
