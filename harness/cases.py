"""Saved counterexamples (JSON) and named sweeps (TOML).

Both live in the caller's project (`harness.project`): counterexamples in its ``counterexamples``
folder (``.harness/counterexamples/`` unless ``[tool.harness]`` moves it; ``cases/counterexamples/`` in
this repository), sweeps in its ``sweeps`` folders and then among the built-in sweeps shipped in the
package (`harness.project.BUILTIN_SWEEPS`). Nothing is read from or written to the package's parent.

A counterexample file is small and readable: the kernel, the problem (with its seed, or its explicit
element values when hypothesis drew them), the metrics and verdict it had, and ``expect``: the verdict
the suite requires when it replays the file (``equivalent`` once the kernel is fixed; a known, accepted
failure can say ``divergent``). The suite replays every file on every run; so does `harness replay`.
A case whose kernel has since been fixed (``expect`` equivalent and equivalent on replay, `no_longer_fails`)
has done its work: a passing `harness check` names its kernel's such cases, a replay says so, and `harness
prune` deletes them (`prune_counterexamples`).

A sweep is a grid: kernels (registered, or a project's own `file.py:attr` with the group's ``family``) x lengths x
dtypes x eps x chunk sizes x regimes, plus fixed problem fields,
and optional kernel pairs compared directly (differential mode). `harness sweep NAME` runs one. A grid
value, a group's kernel or a pair listed twice is refused (every case of it ran twice, unannounced).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from harness.errors import HarnessError, InvalidArgument
from harness.kernels.contract import Family, KernelSpec
from harness.problems import LATER_FIELDS, Problem
from harness.records import kernel_of  # noqa: F401 - one definition, re-exported



def counterexamples_dir() -> Path:
    """The current project's counterexample folder (`harness.project.Project.counterexamples_dir`)."""
    from harness.project import current

    return current().counterexamples_dir

#: Metric fields copied into a counterexample file (what it looked like when it was found).
_KEPT_METRICS = ("verdict", "why", "cause", "cond_max", "max_abs", "max_rel", "ulp_max", "onset_t",
                 "nonfinite_class", "first_nonfinite_t", "outcome", "error")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80]


def counterexample_path(kernel: str, family: str, *, directory: Path | None = None,
                        kernel_target: str | None = None, dtype: str | None = None) -> Path:
    """Where the counterexample of one kernel (and target), family and dtype is saved.

    ``<slug>--<family>[--<dtype>]--<hash>.json``: the slug keeps the name readable, the hash of the full
    kernel name, target, family (and dtype) keeps two kernels whose names share their first 80
    characters (or differ only in characters the slug drops) from writing the same file. The same
    kernel, family and dtype always map to the same file, so a later, smaller counterexample replaces the
    earlier one, and a check that fails in two dtypes keeps both (`harness check` searches each dtype).
    """
    key = [kernel, kernel_target, family] + ([dtype] if dtype else [])
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:10]
    name = f"{_slug(kernel)}--{family}{f'--{dtype}' if dtype else ''}--{digest}.json"
    return Path(directory or counterexamples_dir()) / name


def save_counterexample(record: dict[str, Any], problem: Problem, *, directory: Path | None = None,
                        expect: str = "equivalent", kernel_target: str | None = None) -> Path:
    """Write (overwrite) the counterexample of ``record``'s kernel and family (`counterexample_path`).

    Hypothesis replays the shrunk example last, so overwriting on every failure leaves the minimal one.
    ``kernel_target`` (``path.py:attr``) is stored for kernels that are not registered by name.
    """
    path = counterexample_path(record["kernel"], problem.family.value, directory=directory,
                               kernel_target=kernel_target, dtype=problem.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    grad_of = record.get("grad_of") if record.get("mode") == "grad" else None
    data = {
        "kernel": kernel_of(record),
        "kernel_target": kernel_target,
        "family": problem.family.value,
        "expect": expect,
        "problem": problem.to_dict(),
        "found": {k: record.get(k) for k in _KEPT_METRICS if k in record},
        "n_elements": problem.n_elements(),
    }
    if grad_of is not None:  # a gradient's counterexample: `replay` takes that input's gradient again
        data["grad_of"] = grad_of
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return path


#: The problem fields a saved case always carries (`Problem.to_dict` leaves out only the later fields at their
#: defaults and absent values): `load_case` requires them, so that an edited file that lost one is refused.
SAVED_PROBLEM_FIELDS = tuple(f.name for f in dataclasses.fields(Problem)
                             if f.name not in LATER_FIELDS and f.name != "values")


@dataclass
class SavedCase:
    path: Path
    kernel: str
    kernel_target: str | None
    problem: Problem
    expect: str
    found: dict[str, Any]
    #: The input whose gradient the case is about (a gradient's counterexample), else None: the forward.
    grad_of: str | None = None


def problem_from_json(data: Any, where: str) -> Problem:
    """A `Problem` from decoded JSON, or `InvalidArgument` naming ``where``, the field and the value."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{where}: problem={data!r} is a {type(data).__name__}; expected a JSON object")
    try:
        return Problem.from_dict(data)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidArgument(f"{where}: the problem is not valid ({type(exc).__name__}: {exc}); expected the "
                              "fields of harness.problems.Problem with their types (ints, floats, strings)") from None


def load_case(path: str | Path) -> SavedCase:
    """A saved case, or `InvalidArgument` saying what is wrong with the file (never a traceback)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"case file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                              "expected a JSON case file") from None
    except (OSError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        raise InvalidArgument(f"case file {str(path)!r} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"case file {str(path)!r} holds a JSON {type(data).__name__}; expected an object "
                              "with 'kernel' and 'problem'")
    for key in ("kernel", "problem"):
        if key not in data:
            raise InvalidArgument(f"case file {str(path)!r} has no {key!r} field")
    for key in ("kernel", "kernel_target", "expect", "grad_of"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise InvalidArgument(f"case file {str(path)!r}: {key}={data[key]!r} is not a string")
    verdicts = ("equivalent", "divergent", "out_of_domain", "kernel_error")
    if data.get("expect") is not None and data["expect"] not in verdicts:  # "great": a replay failing on a typo
        raise InvalidArgument(f"case file {str(path)!r}: expect={data['expect']!r}; expected one of {list(verdicts)}")
    found = data.get("found", {})
    problem = problem_from_json(data["problem"], str(path))
    if data.get("family") is not None and data["family"] != problem.family.value:  # two answers: say which
        raise InvalidArgument(f"case file {str(path)!r}: family={data['family']!r} but its problem's family is "
                              f"{problem.family.value!r}; expected the same family in both (an edited file?)")
    if data.get("grad_of") is not None:  # "zzz" was ignored when the forward diverged: the forward replayed
        try:
            check_grad_of(data["grad_of"], problem)
        except InvalidArgument as exc:
            raise InvalidArgument(f"case file {str(path)!r}: {exc}") from None
    missing = [key for key in SAVED_PROBLEM_FIELDS if key not in data["problem"]]
    if missing:  # a default in its place replays another case: a float64 one as float32
        raise InvalidArgument(f"case file {str(path)!r}: its problem has no {missing} (a saved case always carries "
                              f"them; the defaults would replay another case, e.g. dtype float32); expected every "
                              f"field of {list(SAVED_PROBLEM_FIELDS)}")
    return SavedCase(path, data["kernel"], data.get("kernel_target"), problem, data.get("expect", "equivalent"),
                     found if isinstance(found, dict) else {}, data.get("grad_of"))


def check_grad_of(grad_of: str, problem: Problem) -> None:
    """`InvalidArgument` unless ``grad_of`` names an input whose gradient ``problem``'s family takes (or is
    ``*``, the whole backward of a kernel whose backward failed): checked before the case runs, so a bad name
    is said even where the forward diverges and no gradient would be taken."""
    names = problem.definition.grad_inputs
    if grad_of not in (*names, "*"):
        raise InvalidArgument(f"grad_of={grad_of!r} is not an input whose gradient the family "
                              f"{problem.family.value!r} takes; expected one of {list(names)} (or '*', the whole "
                              "backward)")


def _forward_instead(record: dict[str, Any], grad_of: str) -> dict[str, Any]:
    """A gradient replay's forward record, with a note saying why it is the forward's and not the gradient's."""
    note = (f"the gradient of {grad_of} was not taken: the forward is {record.get('verdict')} on this case, and "
            "a gradient is checked only where the forward is equivalent; this is the forward's record (fix the "
            "forward, then replay again to check the gradient)")
    return dict(record, note=note)


def replay(spec, problem: Problem, grad_of: str | None = None, options=None) -> dict[str, Any]:
    """The record of one case run again: its forward, or with ``grad_of`` that input's gradient (the forward
    record instead when the forward is no longer equivalent: no gradient is taken then, and its ``note``
    says so).

    One definition for `harness replay`, the saved-case replays of a project's suite and the plugin: a
    gradient's counterexample replays its gradient, not only the forward that was right all along."""
    from harness.runner import RunOptions, run_case

    options = options or RunOptions()
    if grad_of is None:
        return run_case(spec, problem, options)
    check_grad_of(grad_of, problem)
    from harness.gradients import gradient_case

    records = gradient_case(spec, problem, options)
    for record in records:
        if record.get("mode") != "grad":
            return _forward_instead(record, grad_of)
        if record.get("grad_of") in (grad_of, "*"):
            return record
    taken = sorted(str(r.get("grad_of")) for r in records)
    raise InvalidArgument(f"grad_of={grad_of!r}: the replay took no gradient of that input (taken: {taken or 'none'}, "
                          f"kernel {spec.name}); expected one of the family's differentiable inputs "
                          f"{list(problem.definition.grad_inputs)} of a kernel whose output is differentiable")


def chunk_mismatch(spec, problem: Problem) -> str | None:
    """A note when a replayed problem's chunk size and the kernel disagree, None when they do not: a problem's
    ``chunk_size`` puts a chunked form's term in the bound, which a kernel that takes no chunk size is then judged
    with although it is never told the chunk (a blind hunt's edited problem turned cond 1.55 into 0.025); a kernel
    that takes one, replayed on a problem without, runs at its default and is held to the loop's bound."""
    if not problem.definition.chunk_term:
        return None
    if problem.chunk_size is not None and not spec.capabilities.takes_chunk:
        return (f"note: the problem's chunk_size={problem.chunk_size} widens the bound by a chunked form's term, but "
                f"kernel {spec.name} takes no chunk size (it is not told the chunk); leave chunk_size out (null) to "
                "judge it as it runs, or declare its chunk (a chunk_size parameter, Capabilities(chunk_sizes=...))")
    if problem.chunk_size is None and spec.capabilities.takes_chunk:
        return (f"note: kernel {spec.name} takes a chunk size and the problem gives none: it runs at its default chunk "
                "and is judged against the sequential loop's bound; give \"chunk_size\" in the problem to judge it at "
                "its chunk")
    return None


def saved_cases(directory: Path | None = None) -> list[Path]:
    return sorted(Path(directory or counterexamples_dir()).glob("*.json"))


def resolve_kernel(name: str, target: str | None = None, family: str | None = None, *,
                   trust: bool = False, kernel: str | None = None) -> KernelSpec:
    """The kernel a case names: registered by ``name``, or a user kernel from ``target``.

    A case file is data: its ``target`` (``module:attr`` / ``file.py:attr``) names code, which is
    imported only when the user says so: ``trust`` (``--trust-case-file``), or ``kernel`` (the
    ``--kernel`` given on the command line) equal to it. Otherwise `InvalidArgument` says how to run it.
    """
    from harness.kernels import registry

    if target:
        if not (trust or kernel == target):
            raise InvalidArgument(
                f"kernel_target={target!r}: the case file names code to import, which replay does not do on its "
                f"own (a case file is data); pass --kernel {shlex.quote(target)} to run that kernel, or "
                "--trust-case-file to import what the file names")
        from harness.api import user_kernel_spec

        _check_case_target(target)
        return user_kernel_spec(target, family=family, name=name)
    return registry.get(name)


def _check_case_target(target: str) -> None:
    """`InvalidArgument` when the file of a case's ``kernel_target`` is not found from here, saying that a relative
    one is spelled from the root of the project the case was saved in: from outside it, replay said only
    "file 'mykern/scan.py' does not exist" (blind hunt 23b, P14)."""
    from harness.kernels.target import target_file
    from harness.project import find_root

    path = target_file(target)
    if path is None or path.is_file() or path.is_absolute():
        return
    raise InvalidArgument(f"kernel_target={target!r}: file {str(path)!r} is not found; a case names its kernel's file "
                          "relative to the root of the project it was saved in (the folder holding its "
                          f"pyproject.toml), and the project root here is {str(find_root())!r}: run the replay from "
                          "inside that project, or pass --kernel PATH.py:"
                          f"{target.rpartition(':')[2]} with the file's path from here")


# -------------------------------------------------------------------------------- stale counterexamples
def no_longer_fails(case: SavedCase, record: dict[str, Any]) -> bool:
    """Whether a saved case, replayed as ``record``, can be removed: it waits for its kernel's fix (``expect``
    equivalent, what `save_counterexample` writes) and the replay is equivalent. A case kept on purpose with a
    failing ``expect`` (a planted bug that must stay caught) never can."""
    return case.expect == "equivalent" and record.get("verdict") == "equivalent"


def case_kernel(case: SavedCase) -> str:
    """How ``--kernel`` names a saved case's kernel: its target (a user kernel), else its registered name."""
    return case.kernel_target or case.kernel


def prune_command(kernel: str, directory: Path | None = None) -> str:
    """The `harness prune` command that removes ``kernel``'s saved cases that no longer fail; ``--cases-dir`` only
    where ``directory`` is not the project's counterexamples folder."""
    words = ["harness", "prune", "--kernel", kernel]
    if directory is not None and Path(directory).resolve() != counterexamples_dir().resolve():
        words += ["--cases-dir", str(directory)]
    return shlex.join(words)


def stale_counterexamples(spec: KernelSpec, *, directory: Path | None = None, dtypes: tuple[str, ...] | None = None,
                          device: str = "cpu", options=None) -> list[Path]:
    """The saved cases of ``spec``'s kernel (of ``dtypes`` on ``device``; every dtype when None) that no longer
    fail when replayed on ``spec`` (`no_longer_fails`): what a passing `harness check` names. Each is one case
    run once (a gradient's case: its forward and gradients); no record is stored. A file that cannot be read or
    replayed is left to `harness prune`, which says why."""
    stale = []
    for path in saved_cases(directory):
        try:
            case = load_case(path)
        except InvalidArgument:
            continue
        if (case.kernel != spec.name or case.problem.family is not spec.family or case.expect != "equivalent"
                or case.problem.device != device or (dtypes is not None and case.problem.dtype not in dtypes)):
            continue
        try:
            record = replay(spec, case.problem, case.grad_of, options)
        except HarnessError:
            continue
        if no_longer_fails(case, record):
            stale.append(path)
    return stale


def stale_counterexamples_line(kernel: str, paths: list[Path], directory: Path | None = None) -> str:
    """`harness check`'s line naming ``kernel``'s saved cases that no longer fail, and the command that removes them."""
    one = len(paths) == 1
    return (f"{kernel}: {len(paths)} saved counterexample{'' if one else 's'} no longer fail{'s' if one else ''} "
            f"(equivalent on replay): {', '.join(p.name for p in paths)}; remove {'it' if one else 'them'} with "
            f"`{prune_command(kernel, directory)}`")


@dataclass
class PruneReport:
    """What `prune_counterexamples` did with each saved case it looked at (each a path and, but for
    ``removed``, why it stayed)."""

    dry_run: bool = False
    #: No longer fail (`no_longer_fails`): deleted, or with ``dry_run`` to be deleted.
    removed: list[Path] = field(default_factory=list)
    #: Still fail on replay: the verdict and cause.
    failing: list[tuple[Path, str]] = field(default_factory=list)
    #: Kept on purpose: their ``expect`` is another verdict than equivalent.
    kept: list[tuple[Path, str]] = field(default_factory=list)
    #: Not replayed (unreadable, a kernel not runnable here, code not trusted) or not deletable: why.
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def looked_at(self) -> int:
        return len(self.removed) + len(self.failing) + len(self.kept) + len(self.skipped)


def _names_of(kernel: str) -> set[str]:
    """The names a case may give the kernel ``--kernel`` names: as typed, its target as the harness names it
    (`canonical_target`: a file from the project's root) and that target's kernel name."""
    from harness.kernels.target import canonical_target

    target = canonical_target(kernel)
    return {kernel, target, f"user.{target}"}


def prune_counterexamples(directory: Path | None = None, *, kernel: str | None = None, trust: bool = False,
                          dry_run: bool = False, options=None) -> PruneReport:
    """Replay each saved case of ``directory`` (default: the project's counterexamples folder; only ``kernel``'s
    when given) and delete those that no longer fail (`no_longer_fails`); with ``dry_run`` delete nothing.

    A case of a user kernel names code, imported only as `harness replay` does (`resolve_kernel`): ``kernel``
    naming that target, or ``trust``; otherwise it is kept and the report says how to run it."""
    report = PruneReport(dry_run=dry_run)
    names = _names_of(kernel) if kernel else None
    for path in saved_cases(directory):
        try:
            case = load_case(path)
        except InvalidArgument as exc:
            if names is None:  # whose it is cannot be told: said only when every case is looked at
                report.skipped.append((path, str(exc)))
            continue
        if names is not None and case.kernel not in names and case.kernel_target not in names:
            continue
        if case.expect != "equivalent":
            report.kept.append((path, f"expect {case.expect!r}: kept on purpose"))
            continue
        if not device_present(case.problem.device):
            report.skipped.append((path, f"device {case.problem.device!r} is not present here"))
            continue
        named = case.kernel_target if names is not None and case.kernel_target in names else kernel
        try:
            spec = resolve_kernel(case.kernel, case.kernel_target, case.problem.family.value, trust=trust,
                                  kernel=named)
            reason = spec.unavailable_reason()
            if reason:
                report.skipped.append((path, f"kernel {case.kernel} is unavailable here: {reason}"))
                continue
            record = replay(spec, case.problem, case.grad_of, options)
        except HarnessError as exc:
            report.skipped.append((path, str(exc)))
            continue
        if not no_longer_fails(case, record):
            report.failing.append((path, f"{record.get('verdict')} ({record.get('cause')})"))
            continue
        if not dry_run:
            try:
                path.unlink()
            except OSError as exc:
                report.skipped.append((path, f"no longer fails, but cannot be deleted: {exc.strerror or exc}"))
                continue
        report.removed.append(path)
    return report


# ---------------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepGroup:
    """Kernels of one family and the grid they run over.

    ``kernels`` are as the file names them: registered names, or a project's own kernels as ``file.py:attr``
    (from the project's root) / ``module:attr`` targets, with the group's ``family``. ``specs`` holds each
    target's resolved kernel (registered names are looked up when run)."""

    kernels: list[str]
    grid: dict[str, list[Any]]
    fixed: dict[str, Any] = field(default_factory=dict)
    specs: dict[str, KernelSpec] = field(default_factory=dict)

    def spec(self, name: str) -> KernelSpec:
        """The kernel ``name`` (one of `kernels`) runs as."""
        from harness.kernels import registry

        return self.specs[name] if name in self.specs else registry.get(name)

    def problems(self, family) -> Iterator[Problem]:
        keys = sorted(self.grid)
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            yield Problem(**dict(self.fixed, **dict(zip(keys, combo)), family=family))


@dataclass
class Sweep:
    """A named list of grids (see the module docstring), and kernel pairs compared directly."""

    name: str
    description: str
    groups: list[SweepGroup]
    pairs: list[tuple[str, str]] = field(default_factory=list)
    answers: list = field(default_factory=list)  # harness.answers.AnswerTable: the question it answers
    #: sha256 of the file's parsed TOML: two runs of one sweep name made from different versions of its file
    #: (a grid edited between two shards' jobs) differ in it; comments and layout do not count.
    digest: str = ""

    def spec(self, name: str) -> KernelSpec:
        """The kernel a name of the file runs as: a group's resolved target, else the registered kernel."""
        for group in self.groups:
            if name in group.specs:
                return group.specs[name]
        from harness.kernels import registry

        return registry.get(name)

    def orders(self) -> dict[str, list[Any]]:
        """The order of each grid field's values, and of the kernels (pairs as ``a vs b``), as declared; a
        target kernel by the name its records carry (``user.file.py:attr``)."""
        out: dict[str, list[Any]] = {"kernel": []}
        for group in self.groups:
            named = [group.specs[k].name if k in group.specs else k for k in group.kernels]
            out["kernel"] += [k for k in named if k not in out["kernel"]]
            for name, values in group.grid.items():
                seen = out.setdefault(name, [])
                seen += [v for v in values if v not in seen]
        out["kernel"] += [f"{self.spec(a).name} vs {self.spec(b).name}" for a, b in self.pairs]
        return out

    def cases(self) -> Iterator[tuple[KernelSpec, Problem]]:
        """Every (kernel, problem) of the grids that the kernel can run here, in a stable order.

        Kernels unavailable here are left out (``harness list`` says why).
        """
        for group in self.groups:
            for name in group.kernels:
                spec = group.spec(name)
                if spec.unavailable_reason() is not None:
                    continue
                for problem in group.problems(spec.family):
                    if (runnable(spec, problem) and device_present(problem.device)
                            and (spec.capabilities.takes_chunk or problem.chunk_size is None)):
                        yield spec, problem

    def pair_cases(self) -> Iterator[tuple[KernelSpec, KernelSpec, Problem]]:
        """Each pair on every problem of the groups naming either kernel, that both can run."""
        for name_a, name_b in self.pairs:
            a, b = self.spec(name_a), self.spec(name_b)
            if a.unavailable_reason() or b.unavailable_reason():
                continue
            seen: set[str] = set()
            for group in self.groups:
                if name_a not in group.kernels and name_b not in group.kernels:
                    continue
                for problem in group.problems(a.family):
                    if (problem.key not in seen and device_present(problem.device)
                            and runnable(a, problem) and runnable(b, problem)):
                        seen.add(problem.key)
                        yield a, b, problem


def device_present(device: str) -> bool:
    """Whether ``device`` exists on this machine (a sweep leaves out CUDA cases on a CPU-only one)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available()
    return True


def runnable(spec: KernelSpec, problem: Problem) -> bool:
    """Whether ``problem`` lies inside ``spec``'s declared capabilities."""
    caps = spec.capabilities
    if caps.runs(problem.dtype, problem.device) is not None or problem.regime in caps.skip_regimes:
        return False
    if not caps.accepts_length(problem.length, problem.chunk_size):
        return False
    if caps.takes_chunk and problem.chunk_size is None:
        return False
    if problem.chunk_size is not None and caps.chunk_sizes and problem.chunk_size not in caps.chunk_sizes:
        return False  # a kernel that forms its own chunks (fla's fused_chunk: 64) runs only those
    if problem.definition.draws_head_dims and any(caps.fit_head_dim(d) != d for d in (problem.dk, problem.dv)):
        return False  # head dims it does not take (fla's tl.dot sizes; even ones for its chunk backward)
    return True


@dataclass(frozen=True)
class SweepFile:
    """A named sweep found on disk, and where from: ``project`` (its own folders) or ``built-in``."""

    name: str
    path: Path
    origin: str


def sweep_files(project=None) -> list[SweepFile]:
    """Every sweep ``project`` (default: the current one) can run by name, first folder first; a project
    sweep hides a built-in one of the same name."""
    from harness.project import BUILTIN_SWEEPS, current

    project = project or current()
    found: dict[str, SweepFile] = {}
    for folder in project.sweep_dirs:
        origin = "built-in" if folder == BUILTIN_SWEEPS else "project"
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found.setdefault(path.stem, SweepFile(path.stem, path, origin))
    return list(found.values())


def sweep_path(name: str, project=None) -> Path:
    """The file of sweep ``name``: a ``.toml`` path, else the first sweep of that name (`sweep_files`)."""
    path = Path(name)
    if path.suffix == ".toml" and path.is_file():
        return path
    files = sweep_files(project)
    for sweep in files:
        if sweep.name == name:
            return sweep.path
    from harness.project import current

    folders = ", ".join(str(d) for d in (project or current()).sweep_dirs)
    raise InvalidArgument(f"sweep={name!r} is not a .toml file nor a sweep in {folders}; known sweeps: "
                          f"{', '.join(s.name for s in files) or '(none)'} (`harness sweep --list`)")


#: The keys a sweep file may hold: at its top level, and in a group (or a one-grid file's top level).
SWEEP_KEYS = frozenset({"name", "description", "pairs", "group", "answer"})
GROUP_KEYS = frozenset({"kernels", "grid", "fixed", "family"})


def _check_keys(data: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidArgument(f"sweep {where}: unknown key(s) {unknown}; expected some of {sorted(allowed)}")


def _check_required(grid: dict[str, Any], fixed: dict[str, Any], where: str) -> None:
    """`InvalidArgument` naming a problem field with no default (``length``) that neither the grid nor the fixed
    values give: it read "a grid or fixed value has the wrong type (Problem.__init__() missing 1 required
    positional argument: 'length')" (blind hunt 23b, P16)."""
    import dataclasses

    required = [f.name for f in dataclasses.fields(Problem) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING and f.name != "family"]  # the family is the kernel's
    missing = [name for name in required if name not in grid and name not in fixed]
    if missing:
        raise InvalidArgument(f"sweep {where}: neither [grid] nor [fixed] gives {missing}; expected e.g. "
                              f"{missing[0]} = [16, 64] under [grid] (every problem needs one)")


def _check_pair(pair: list[Any], where: str, sweep: "Sweep") -> None:
    """`InvalidArgument` naming the sweep file and the ``pairs`` entry whose two kernels cannot be compared: not
    registered (nor a target of a group), or of two families (the error came from the run, after the grid's
    cases, naming neither)."""
    try:
        a, b = (sweep.spec(name) for name in pair)
    except InvalidArgument as exc:
        raise InvalidArgument(f"sweep {where}: pairs entry {pair!r}: {exc}") from None
    if a.family is not b.family:
        raise InvalidArgument(f"sweep {where}: pairs entry {pair!r}: kernel {pair[0]!r} is a {a.family.value} kernel "
                              f"and {pair[1]!r} a {b.family.value} one; expected two kernels of one family (a pair "
                              "runs both on the same problems)")


def _target_specs(kernels: list[str], family: Any, root: Path, where: str) -> dict[str, KernelSpec]:
    """The group's ``file.py:attr`` / ``module:attr`` kernels resolved as user kernels of ``family`` (a file from
    the project's ``root``, as ``[[tool.harness.kernels]]`` names it), by the name the file gives them."""
    from harness.api import user_kernel_spec
    from harness.kernels import registry
    from harness.kernels.target import file_part

    targets = [k for k in kernels if ":" in k]
    if not targets:
        return {}
    if family is None:
        registered = [k for k in kernels if ":" not in k]
        if not registered:
            raise InvalidArgument(f"sweep {where}: kernels={targets!r} are targets and the group has no family; "
                                  "expected family = \"...\" beside them (one of "
                                  f"{', '.join(f.value for f in Family)})")
        family = registry.get(registered[0]).family.value
    specs = {}
    for name in targets:
        path = file_part(name)
        spelled = name if path is None or path.is_absolute() else f"{root / path}:{name.rpartition(':')[2]}"
        try:
            specs[name] = user_kernel_spec(spelled, family=family)  # named from the root of the project run in
        except InvalidArgument as exc:
            raise InvalidArgument(f"sweep {where}: kernel {name!r} (from {str(root)!r}): {exc}") from None
    return specs


def _refuse_twice(what: str, values: list[Any]) -> None:
    """`InvalidArgument` where ``values`` (a sweep's grid values, kernels or pairs) holds one more than once:
    every case of it ran twice, unannounced, and weighed twice in the report's counts."""
    twice = sorted({repr(v) for i, v in enumerate(values) if v in values[:i]})
    if twice:
        raise InvalidArgument(f"{what}={values!r} lists {', '.join(twice)} more than once; expected each once")


def _group(data: dict[str, Any], where: str, root: Path) -> SweepGroup:
    import dataclasses

    if not isinstance(data, dict):
        raise InvalidArgument(f"sweep {where} is a {type(data).__name__}; expected a table")
    _check_keys(data, GROUP_KEYS, where)
    for key in ("kernels", "grid"):
        if key not in data:
            raise InvalidArgument(f"sweep {where} has no {key!r} entry")
    kernels, grid, fixed = data["kernels"], data["grid"], data.get("fixed", {})
    if not isinstance(kernels, list) or not kernels or not all(isinstance(k, str) for k in kernels):
        raise InvalidArgument(f"sweep {where}: kernels={kernels!r}; expected a non-empty list of kernel names")
    _refuse_twice(f"sweep {where}: kernels", kernels)
    family = data.get("family")
    if family is not None:
        try:
            family = Family.parse(family).value
        except (InvalidArgument, ValueError, TypeError):
            raise InvalidArgument(f"sweep {where}: family={family!r}; expected one of "
                                  f"{', '.join(f.value for f in Family)}") from None
    specs = _target_specs(kernels, family, root, where)
    for key, value in (("grid", grid), ("fixed", fixed)):
        if not isinstance(value, dict):
            raise InvalidArgument(f"sweep {where}: {key}={value!r}; expected a table of problem fields")
    fields = {f.name for f in dataclasses.fields(Problem)} - {"family", "values"}
    for key, value in (("grid", grid), ("fixed", fixed)):
        _check_keys(value, frozenset(fields), f"{where} [{key}]")
    grid = {k: list(v) if isinstance(v, list) else [v] for k, v in grid.items()}
    empty = sorted(k for k, v in grid.items() if not v)
    if empty:
        raise InvalidArgument(f"sweep {where}: grid {empty} empty; expected at least one value each")
    for key, values in grid.items():  # a value listed twice ran every case of it twice (blind hunt, session 23)
        _refuse_twice(f"sweep {where}: grid {key}", values)
    _check_required(grid, fixed, where)
    group = SweepGroup(kernels=list(kernels), grid=grid, fixed=dict(fixed), specs=specs)
    try:
        families = {group.spec(k).family for k in kernels}
        if family is not None and families != {Family.parse(family)} or len(families) > 1:
            raise InvalidArgument(f"kernels {kernels!r} are of families {sorted(f.value for f in families)}"
                                  + (f", the group's family is {family!r}" if family is not None else "")
                                  + "; expected one family per group")
        for _ in group.problems(families.pop()):  # every problem of the grid, before any kernel runs: a bad value
            pass  # found after hours of a sweep would lose the run (L = 10**9 as the last length did)
    except InvalidArgument as exc:
        raise InvalidArgument(f"sweep {where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"sweep {where}: a grid or fixed value has the wrong type ({exc})") from None
    return group


def load_sweep(name: str, project=None) -> Sweep:
    """A sweep file: either one grid (kernels, [grid], [fixed]) or several ``[[group]]`` tables.

    A file that is not TOML, or holds a key the harness does not know (a typo would otherwise be
    ignored silently), is an `InvalidArgument` naming the file and the key.
    """
    from harness.project import find_root

    path = sweep_path(name, project)
    root = find_root(path.resolve().parent)  # a file kernel of the sweep is named from its project's root
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"sweep file {str(path)!r} is not UTF-8 text ({exc.reason}); expected TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"sweep file {str(path)!r} is not valid TOML: {exc}") from None
    if "group" in data:
        _check_keys(data, SWEEP_KEYS, str(path))
        if not isinstance(data["group"], list):
            raise InvalidArgument(f"sweep {path}: group={data['group']!r}; expected [[group]] tables")
        groups = [_group(g, f"{path}: group {i}", root) for i, g in enumerate(data["group"])]
    else:
        _check_keys(data, SWEEP_KEYS | GROUP_KEYS, str(path))
        groups = [_group({k: v for k, v in data.items() if k in GROUP_KEYS}, str(path), root)]
    pairs = data.get("pairs", [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise InvalidArgument(f"sweep {path}: pairs={pairs!r}; expected a list of [kernel_a, kernel_b]")
    _refuse_twice(f"sweep {path}: pairs", pairs)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    sweep = Sweep(name=data.get("name", path.stem), description=data.get("description", ""), groups=groups,
                  pairs=[tuple(p) for p in pairs], digest=digest)
    for pair in pairs:
        _check_pair(pair, str(path), sweep)
    if "answer" in data:
        from harness.answers import parse_answers

        sweep.answers = parse_answers(data["answer"], f"sweep {path}", sweep.orders())
    return sweep


def grid_size(sweep: Sweep) -> int:
    """How many (kernel, problem) cases the sweep's grids declare, before any is left out here."""
    import math

    return sum(len(g.kernels) * math.prod(len(v) for v in g.grid.values()) for g in sweep.groups)
