"""The `cases/` folder: saved counterexamples (JSON) and named sweeps (TOML).

A counterexample file is small and readable: the kernel, the problem (with its seed, or its explicit
element values when hypothesis drew them), the metrics and verdict it had, and ``expect``: the verdict
the suite requires when it replays the file (``equivalent`` once the kernel is fixed; a known, accepted
failure can say ``divergent``). The suite replays every file on every run; so does `harness replay`.

A sweep is a grid: kernels x lengths x dtypes x eps x chunk sizes x regimes, plus fixed problem fields,
and optional kernel pairs compared directly (differential mode). `harness sweep NAME` runs one.
"""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from harness.errors import InvalidArgument
from harness.kernels.contract import KernelSpec
from harness.problems import Problem

ROOT = Path(__file__).resolve().parent.parent
CASES_DIR = ROOT / "cases"
COUNTEREXAMPLES_DIR = CASES_DIR / "counterexamples"
SWEEPS_DIR = CASES_DIR / "sweeps"

#: Metric fields copied into a counterexample file (what it looked like when it was found).
_KEPT_METRICS = ("verdict", "why", "cause", "cond_max", "max_abs", "max_rel", "ulp_max", "onset_t",
                 "nonfinite_class", "first_nonfinite_t", "outcome", "error")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80]


def save_counterexample(record: dict[str, Any], problem: Problem, *, directory: Path | None = None,
                        expect: str = "equivalent", kernel_target: str | None = None) -> Path:
    """Write (overwrite) the counterexample of ``record``'s kernel and family.

    Hypothesis replays the shrunk example last, so overwriting on every failure leaves the minimal one.
    ``kernel_target`` (``path.py:attr``) is stored for kernels that are not registered by name.
    """
    directory = Path(directory or COUNTEREXAMPLES_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    kernel = record["kernel"]
    data = {
        "kernel": kernel,
        "kernel_target": kernel_target,
        "family": problem.family.value,
        "expect": expect,
        "problem": problem.to_dict(),
        "found": {k: record.get(k) for k in _KEPT_METRICS if k in record},
        "n_elements": problem.n_elements(),
    }
    path = directory / f"{_slug(kernel)}--{problem.family.value}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return path


@dataclass
class SavedCase:
    path: Path
    kernel: str
    kernel_target: str | None
    problem: Problem
    expect: str
    found: dict[str, Any]


def load_case(path: str | Path) -> SavedCase:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"case file {str(path)!r} cannot be read as JSON: {exc}") from None
    for key in ("kernel", "problem"):
        if key not in data:
            raise InvalidArgument(f"case file {str(path)!r} has no {key!r} field")
    return SavedCase(path, data["kernel"], data.get("kernel_target"), Problem.from_dict(data["problem"]),
                     data.get("expect", "equivalent"), data.get("found", {}))


def saved_cases(directory: Path | None = None) -> list[Path]:
    return sorted(Path(directory or COUNTEREXAMPLES_DIR).glob("*.json"))


def resolve_kernel(name: str, target: str | None = None, family: str | None = None) -> KernelSpec:
    """A registered kernel by name, or a user kernel from ``target`` (``module:attr`` / ``file.py:attr``)."""
    from harness.kernels import registry

    if target:
        from harness.api import user_kernel_spec

        return user_kernel_spec(target, family=family, name=name)
    return registry.get(name)


# ---------------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepGroup:
    """Kernels of one family and the grid they run over."""

    kernels: list[str]
    grid: dict[str, list[Any]]
    fixed: dict[str, Any] = field(default_factory=dict)

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

    def orders(self) -> dict[str, list[Any]]:
        """The order of each grid field's values, and of the kernels (pairs as ``a vs b``), as declared."""
        out: dict[str, list[Any]] = {"kernel": []}
        for group in self.groups:
            out["kernel"] += [k for k in group.kernels if k not in out["kernel"]]
            for name, values in group.grid.items():
                seen = out.setdefault(name, [])
                seen += [v for v in values if v not in seen]
        out["kernel"] += [f"{a} vs {b}" for a, b in self.pairs]
        return out

    def cases(self) -> Iterator[tuple[KernelSpec, Problem]]:
        """Every (kernel, problem) of the grids that the kernel can run here, in a stable order.

        Kernels unavailable here are left out (``harness list`` says why).
        """
        from harness.kernels import registry

        for group in self.groups:
            for name in group.kernels:
                spec = registry.get(name)
                if spec.unavailable_reason() is not None:
                    continue
                for problem in group.problems(spec.family):
                    if (runnable(spec, problem) and device_present(problem.device)
                            and (spec.capabilities.takes_chunk or problem.chunk_size is None)):
                        yield spec, problem

    def pair_cases(self) -> Iterator[tuple[KernelSpec, KernelSpec, Problem]]:
        """Each pair on every problem of the groups naming either kernel, that both can run."""
        from harness.kernels import registry

        for name_a, name_b in self.pairs:
            a, b = registry.get(name_a), registry.get(name_b)
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
    if caps.runs(problem.dtype, problem.device) is not None:
        return False
    if not caps.accepts_length(problem.length, problem.chunk_size):
        return False
    if caps.takes_chunk and problem.chunk_size is None:
        return False
    return True


def sweep_path(name: str) -> Path:
    path = Path(name)
    if path.suffix == ".toml" and path.is_file():
        return path
    candidate = SWEEPS_DIR / f"{name}.toml"
    if not candidate.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.toml")))
        raise InvalidArgument(f"sweep={name!r} is not a file nor a sweep in cases/sweeps/; known sweeps: {known}")
    return candidate


def _group(data: dict[str, Any], where: str) -> SweepGroup:
    for key in ("kernels", "grid"):
        if key not in data:
            raise InvalidArgument(f"sweep {where} has no {key!r} entry")
    grid = {k: list(v) if isinstance(v, list) else [v] for k, v in data["grid"].items()}
    return SweepGroup(kernels=list(data["kernels"]), grid=grid, fixed=dict(data.get("fixed", {})))


def load_sweep(name: str) -> Sweep:
    """A sweep file: either one grid (kernels, [grid], [fixed]) or several ``[[group]]`` tables."""
    path = sweep_path(name)
    data = tomllib.loads(path.read_text())
    if "group" in data:
        groups = [_group(g, f"{path}: group {i}") for i, g in enumerate(data["group"])]
    else:
        groups = [_group(data, str(path))]
    sweep = Sweep(name=data.get("name", path.stem), description=data.get("description", ""), groups=groups,
                  pairs=[tuple(p) for p in data.get("pairs", [])])
    if "answer" in data:
        from harness.answers import parse_answers

        sweep.answers = parse_answers(data["answer"], str(path), sweep.orders())
    return sweep


def list_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
