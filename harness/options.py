"""The report/gate options shared by the pytest plugin and the `harness` command line.

One function, `add_report_options`, defines them for both front doors (as pytest-benchmark's
``add_global_options`` does), so a flag means the same thing in ``pytest --harness-fail-on cond:2x`` and
``harness gate --fail-on cond:2x``:

=====================  ===========================  ==========================================================
pytest                 CLI                          meaning
=====================  ===========================  ==========================================================
--harness-report-dir   --report-dir DIR             where the run's records and report (index.md, CSV, JSON,
                                                    PNG) are written; pytest writes none unless given
--harness-baseline     --baseline DIR               a baseline run directory to gate against
--harness-fail-on      --fail-on SPEC               gate terms, e.g. ``cond:1.5x,rel:2x`` (default
                                                    `DEFAULT_FAIL_ON`); see `harness.gate.parse_fail_on`
--harness-allow-missing  --allow-missing            pass the gate although the run checked less than the baseline
                                                    (kernels, dtypes, gradients, examples, cells, profile); each
                                                    shortfall is still printed as a warning. Without it (and with
                                                    the older --fail-on-missing, which says the default) it fails
--harness-policy       --policy SPEC                verdict thresholds, parsed by `harness.verdict.Policy.parse`
--harness-no-summary   --no-summary                 no summary table on the terminal
--harness-timeout      --timeout SECONDS            per kernel call (default: the profile's, 120 s; nightly
                                                    900 s); longer is a ``timeout``
                                                    kernel error, recorded once, not re-run by the shrinker
--harness-in-process   --in-process                 run kernels in this process, not a worker process per
                                                    kernel (for pdb; a crashing kernel then ends the run)
=====================  ===========================  ==========================================================

This module imports nothing heavy: pytest loads it while parsing the command line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

#: The gate's terms when none are given: fail when a cell's condition-normalized error grows by half.
DEFAULT_FAIL_ON = "cond:1.5x"

#: The prefix of every option in pytest (``--harness-report-dir``); the CLI uses none.
PYTEST_PREFIX = "harness-"

# name -> (keyword arguments of add_argument / addoption). Names are the CLI spelling.
_OPTIONS: dict[str, dict[str, Any]] = {
    "report-dir": dict(
        metavar="DIR", default=None,
        help="write the run's records and its report (index.md, CSV, JSON, PNG plots) into DIR; "
             "for pytest, no report is written unless this is given",
    ),
    "baseline": dict(
        metavar="DIR", default=None,
        help="a baseline run directory (e.g. reports/baseline) to gate this run against",
    ),
    "fail-on": dict(
        metavar="SPEC", default=None,
        help=f"gate terms, comma-separated metric:factor, e.g. 'cond:1.5x,rel:2x,ulp:4x,abs:10x' "
             f"(metrics: cond, rel, abs, ulp, rms, baseline; default {DEFAULT_FAIL_ON!r})",
    ),
    "allow-missing": dict(
        action="store_true", default=False,
        help="pass the gate although this run checked less than the baseline (a kernel, a dtype, gradients, "
             "examples, cells, a smaller profile); each shortfall is still printed as a warning",
    ),
    "fail-on-missing": dict(
        action="store_true", default=False,
        help="fail the gate when this run checked less than the baseline: the default, kept for older scripts",
    ),
    "policy": dict(
        metavar="SPEC", default=None,
        help="verdict thresholds overriding the defaults, e.g. 'cond=4,baseline=3' "
             "(keys: cond, baseline, min_compared, fail_ood; see harness.verdict.Policy.parse)",
    ),
    "no-summary": dict(
        action="store_true", default=False,
        help="do not print the harness summary table at the end of the session",
    ),
    "timeout": dict(
        metavar="SECONDS", default=None, type=lambda text: _seconds(text),
        help="per kernel call (default: the profile's, 120; nightly 900); a call that takes longer is a "
             "'timeout' kernel_error, recorded once and not re-run by the shrinker",
    ),
    "in-process": dict(
        action="store_true", default=False,
        help="run kernels in this process instead of a worker process per kernel: for stepping through a "
             "kernel with pdb/breakpoint(); a kernel that crashes then ends the run",
    ),
}


def _seconds(text: str) -> float:
    """``--timeout``'s type: seconds > 0 (argparse and pytest show the message as a usage error)."""
    from harness.errors import InvalidArgument
    from harness.kernels.isolation import validate_timeout

    try:
        return validate_timeout(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

#: Which options each CLI subcommand takes (``command=None``: all of them).
COMMAND_OPTIONS: dict[str, tuple[str, ...]] = {
    "check": ("report-dir", "policy", "no-summary", "timeout", "in-process"),
    "sweep": ("report-dir", "policy", "no-summary", "timeout", "in-process"),
    "replay": ("policy", "timeout", "in-process"),
    "gate": ("baseline", "fail-on", "allow-missing", "fail-on-missing"),
}


def add_report_options(adder: Any, *, prefix: str | None = None, cli: bool = False,
                       command: str | None = None) -> list[str]:
    """Define the shared options on ``adder``; return the option strings added.

    ``adder`` is any of: an `argparse.ArgumentParser` (or argument group), a pytest ``Parser`` or
    ``OptionGroup`` (their ``addoption``), or a bare callable with ``add_argument``'s signature.
    ``prefix`` defaults to ``"harness-"`` for pytest and ``""`` with ``cli=True``. ``command`` restricts
    the options to those of one CLI subcommand (`COMMAND_OPTIONS`). An option the parser already
    defines (argparse conflict) is left as the parser has it.
    """
    if prefix is None:
        prefix = "" if cli else PYTEST_PREFIX
    add: Callable[..., Any]
    if hasattr(adder, "add_argument"):
        add = adder.add_argument
    elif hasattr(adder, "addoption"):
        add = adder.addoption
    elif callable(adder):
        add = adder
    else:
        from harness.errors import InvalidArgument

        raise InvalidArgument(f"adder={adder!r} has neither add_argument nor addoption and is not callable; "
                              "pass an argparse parser, a pytest parser or group, or its addoption")
    if command is not None and command not in COMMAND_OPTIONS:
        names: tuple[str, ...] = ()
    else:
        names = COMMAND_OPTIONS[command] if command is not None else tuple(_OPTIONS)
    added = []
    for name in names:
        flag = f"--{prefix}{name}"
        try:
            add(flag, **_OPTIONS[name])
        except argparse.ArgumentError:
            continue  # the subcommand defines this option itself (e.g. gate's --baseline default)
        added.append(flag)
    return added


@dataclass(frozen=True)
class ReportOptions:
    """The values of the shared options, read from an argparse namespace or a pytest config."""

    report_dir: str | None = None
    baseline: str | None = None
    fail_on: str | None = None
    allow_missing: bool = False
    fail_on_missing: bool = False
    policy: str | None = None
    no_summary: bool = False
    timeout: float | None = None
    in_process: bool = False

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, *, prefix: str = "") -> "ReportOptions":
        stem = prefix.replace("-", "_")
        return cls(**{f: getattr(ns, stem + f, default) for f, default in _defaults().items()})

    @classmethod
    def from_pytest(cls, config: Any) -> "ReportOptions":
        stem = PYTEST_PREFIX.replace("-", "_")
        return cls(**{f: config.getoption(stem + f, default) for f, default in _defaults().items()})


def _defaults() -> dict[str, Any]:
    return {name.replace("-", "_"): spec.get("default") for name, spec in _OPTIONS.items()}
