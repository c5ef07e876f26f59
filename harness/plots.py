"""PNG figures of a run, drawn from its records (matplotlib, Agg canvas, imported lazily).

`write_plots(records, out_dir)` writes, skipping a figure when no record fits it:

- ``plot_error_vs_length_<family>.png``: the condition-normalized error (cond_max) against length,
  log-log, one line per kernel x dtype (the worst case at each length), a marker per verdict, and the
  a-priori rounding bound (cond = 1) as a dashed line;
- ``plot_error_vs_eps.png``: retention_normed only: cond_max against the norm's eps, log x, with
  eps = 0 placed at a labelled left edge;
- ``plot_error_vs_log_decay.png``: the gated families' ``uniform_decay`` cases: cond_max against the
  decay strength (-decay_floor, log x), one line per kernel x chunk size x dtype (sweep ``gated_decay``);
- ``plot_onset.png``: the first mismatched position (onset_t) against length, with the end of the
  sequence (t = L - 1) for reference;
- ``case_<kernel>_<case>.png`` (`write_case_figures`, the worst failing case of each kind, up to a limit):
  one case along the sequence (`plot_case`).

Each title states the figure's one message (within the bound or not, the worst case). No pyplot and
no global backend switch: figures are drawn on `matplotlib.backends.backend_agg.FigureCanvasAgg`, so
importing this module never changes how a user's own plots behave. File names are fixed and the PNGs
carry no timestamp or software version, so the same records give the same bytes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

#: Marker per verdict (kernel_error records carry no metrics and are not drawn).
VERDICT_MARKERS: dict[str, str] = {"equivalent": "o", "divergent": "X", "out_of_domain": "^", "kernel_error": "s"}

#: Legend entries above which the legend moves outside the axes.
MAX_INSIDE_LEGEND = 8

_FIGSIZE = (8.0, 5.0)
_DPI = 100
_LINESTYLES = ("-", "--", "-.", ":")


def _num(value: Any) -> float:
    from harness.report import number

    return number(value)


#: The range drawn on a log axis: matplotlib's log transform overflows (inf limits, singular matrices)
#: within a few decades of float64's limits, and a kernel's error can be 1e308. A value beyond is drawn
#: at the edge; the tables and titles carry it exactly.
LOG_AXIS_RANGE = (1e-150, 1e150)


def _on_log_axis(value: float) -> float:
    """``value`` (positive) clipped into `LOG_AXIS_RANGE`, so that a figure never fails on its size."""
    low, high = LOG_AXIS_RANGE
    return min(max(value, low), high)


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def _power_label(value: float, base: float) -> str:
    """A log axis's label at a power of ``base``: ``10⁻³`` in plain text (unicode superscripts), ``1`` to
    ``1000`` and a base-2 axis's lengths as integers; "" between powers; ``0`` and negatives for symlog."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return ""
    exponent = math.log(abs(value), base)
    k = round(exponent)
    if abs(exponent - k) > 1e-6:
        return ""
    sign = "\u2212" if value < 0 else ""
    if 0 <= k and base ** k < 10**6 and (base == 2 or k <= 3):
        return f"{sign}{round(base ** k)}"
    return f"{sign}{base:g}{str(k).translate(_SUPERSCRIPT)}"


def _log_scale(ax, which: str, scale: str = "log", **kwargs: Any) -> None:
    """``ax.set_{which}scale(scale, **kwargs)`` with plain-text labels and two minor ticks a decade.

    matplotlib's default log labels are mathtext (``$10^{-3}$``), parsed per label, and its minor ticks
    are eight objects per decade: together two thirds of a figure's drawing time (about 1 s a case
    figure on this project's machine, 12 figures a failing `harness check`). The minor ticks (at 2 and 5)
    carry a label only when the view spans less than two decades, where the powers alone say too little.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator

    getattr(ax, f"set_{which}scale")(scale, **kwargs)
    axis = ax.xaxis if which == "x" else ax.yaxis
    base = float(kwargs.get("base", 10))

    def minor_label(value: float, _pos: Any) -> str:
        low, high = sorted(abs(v) for v in axis.get_view_interval())
        narrow = low > 0 and math.log(high / low, base) < 2
        return f"{value:.3g}" if narrow else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _pos: _power_label(value, base)))
    if scale == "log":
        axis.set_minor_locator(LogLocator(base=base, subs=(2.0, 5.0) if base == 10 else ()))
        axis.set_minor_formatter(FuncFormatter(minor_label))


def _positive(value: Any) -> bool:
    v = _num(value)
    return math.isfinite(v) and v > 0


def _series_key(r: Mapping[str, Any]) -> tuple[str, str]:
    return (str(r.get("kernel")), str(r.get("dtype")))


def _by_series(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Records grouped by their line in a figure (kernel x dtype), in record order."""
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        series.setdefault(_series_key(r), []).append(r)
    return series


def _style(index: int) -> dict[str, Any]:
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    return {"color": colors[index % len(colors)], "linestyle": _LINESTYLES[(index // len(colors)) % len(_LINESTYLES)]}


def _new_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _legend(ax, series_handles: list, verdicts: set[str]) -> None:
    from matplotlib.lines import Line2D

    handles = list(series_handles)
    for v in sorted(verdicts, key=lambda v: list(VERDICT_MARKERS).index(v) if v in VERDICT_MARKERS else 99):
        handles.append(Line2D([], [], color="0.3", marker=VERDICT_MARKERS.get(v, "o"), linestyle="none", label=v))
    if not handles:
        return
    if len(handles) > MAX_INSIDE_LEGEND:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    else:
        ax.legend(handles=handles, loc="best", fontsize="small")


def _save(fig, path: Path) -> Path:
    fig.savefig(path, format="png", dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    return path


def _ordered(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    from harness.report import canonical_order

    return canonical_order(records)


def _plot_cond_series(ax, series: Mapping[Any, Sequence[Mapping[str, Any]]],
                      x: Callable[[Mapping[str, Any]], float]) -> tuple[list, set[str]]:
    """Each series' worst cond_max at each x as a line, every record as a marker of its verdict, and the
    cond = 1 rounding bound; returns the legend handles and the verdicts drawn."""
    handles, verdicts = [], set()
    for i, (key, rs) in enumerate(sorted(series.items())):
        style = _style(i)
        worst_at: dict[float, float] = {}
        for r in rs:
            worst_at[x(r)] = max(_on_log_axis(_num(r.get("cond_max"))), worst_at.get(x(r), 0.0))
        xs = sorted(worst_at)
        (line,) = ax.plot(xs, [worst_at[v] for v in xs], label=f"{key[0]} {key[1]}", linewidth=1.2, **style)
        handles.append(line)
        by_verdict: dict[str, list[Mapping[str, Any]]] = {}
        for r in rs:
            by_verdict.setdefault(str(r.get("verdict")), []).append(r)
        for v, vr in sorted(by_verdict.items()):
            verdicts.add(v)
            ax.scatter([x(r) for r in vr], [_on_log_axis(_num(r.get("cond_max"))) for r in vr],
                       marker=VERDICT_MARKERS.get(v, "o"), color=style["color"], s=24, zorder=3)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1.0)
    ax.annotate("rounding bound (cond = 1)", xy=(0.01, 1.0), xycoords=("axes fraction", "data"),
                fontsize="small", color="0.3", va="bottom")
    return handles, verdicts


# ------------------------------------------------------------------------------------- error vs length
def plot_error_vs_length(records: Sequence[Mapping[str, Any]], family: str, path: str | os.PathLike) -> Path | None:
    """cond_max against length (log-log) for one family; None (nothing written) when no record fits."""
    recs = [r for r in _ordered(records)
            if str(r.get("family")) == family and _positive(r.get("length")) and _positive(r.get("cond_max"))]
    if not recs:
        return None
    fig, ax = _new_figure()
    series = _by_series(recs)
    handles, verdicts = _plot_cond_series(ax, series, lambda r: _num(r.get("length")))
    _log_scale(ax, "x", "log", base=2)
    _log_scale(ax, "y", "log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("condition-normalized error (cond_max)")
    ax.set_title(_length_title(family, [r for r in records if str(r.get("family")) == family], recs, series),
                 fontsize="medium", wrap=True)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, handles, verdicts)
    return _save(fig, Path(path))


def _length_title(family: str, every: Sequence[Mapping[str, Any]], drawn: Sequence[Mapping[str, Any]],
                  series: Mapping[Any, Any]) -> str:
    """The error-vs-length figure's title: whether every kernel x dtype stays within the bound, from the verdicts
    of all the family's cases, not only those drawn. A run with 46 divergent cases (their cond over the finite
    elements below 1, NaN elsewhere; two with no finite cond, not drawn) was titled "every kernel x dtype within
    the rounding bound" (a blind hunt, session 24)."""
    worst = max(drawn, key=lambda r: _num(r.get("cond_max")))
    where = f"worst {_num(worst.get('cond_max')):.3g}: {worst.get('kernel')} {worst.get('dtype')}"
    over = sorted({_series_key(r) for r in drawn if _num(r.get("cond_max")) > 1.0})
    verdicts = [str(r.get("verdict")) for r in every]
    failing = {v: verdicts.count(v) for v in ("divergent", "kernel_error") if v in verdicts}
    exceed = (f"{len(over)} of {len(series)} kernel x dtype exceed the rounding bound "
              f"({where} L={int(_num(worst.get('length')))})")
    if failing:
        title = f"{family}: " + ", ".join(f"{n} {v}" for v, n in failing.items()) + f" of {len(every)} cases; {exceed}"
    elif over:
        title = f"{family}: {exceed}"
    else:
        title = f"{family}: every kernel x dtype within the rounding bound ({where})"
    out = verdicts.count("out_of_domain")
    if out:
        title += f"; {out} out of domain (judged on their in-domain elements)"
    if len(every) > len(drawn):
        title += f"; {len(every) - len(drawn)} not drawn (cond 0 or not finite)"
    return title


# ---------------------------------------------------------------------------------------- error vs eps
def plot_error_vs_eps(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path | None:
    """cond_max against eps for retention_normed (log x; eps = 0 at the labelled left edge)."""
    recs = [r for r in _ordered(records)
            if str(r.get("family")) == "retention_normed" and r.get("eps") is not None
            and math.isfinite(_num(r.get("eps"))) and _num(r.get("eps")) >= 0 and _positive(r.get("cond_max"))]
    if not recs:
        return None
    positive = sorted({_num(r.get("eps")) for r in recs if _num(r.get("eps")) > 0})
    has_zero = any(_num(r.get("eps")) == 0 for r in recs)
    # eps = 0 cannot sit on a log axis: draw it one decade left of the smallest positive eps.
    zero_x = _on_log_axis(positive[0]) / 10.0 if positive else 1.0

    def x_of(eps: float) -> float:
        return _on_log_axis(eps) if eps > 0 else zero_x

    fig, ax = _new_figure()
    series = _by_series(recs)
    handles, verdicts = _plot_cond_series(ax, series, lambda r: x_of(_num(r.get("eps"))))
    _log_scale(ax, "x", "log")
    _log_scale(ax, "y", "log")
    if has_zero:
        ax.minorticks_off()
        ticks = [zero_x, *positive]
        ax.set_xticks(ticks)
        ax.set_xticklabels(["0", *(f"{e:.0e}" if e < 0.01 else f"{e:g}" for e in positive)], fontsize="small")
        if positive:  # a dotted break between eps = 0 and the log axis proper
            ax.axvline(zero_x * 3.0, color="0.7", linewidth=0.8, linestyle=":")
    ax.set_xlabel("eps of the normalization" + (" (eps = 0 at the left edge)" if has_zero else ""))
    ax.set_ylabel("condition-normalized error (cond_max)")
    worst = max(recs, key=lambda r: _num(r.get("cond_max")))
    ax.set_title(f"retention_normed: error against eps (worst {_num(worst.get('cond_max')):.3g} at "
                 f"eps={_num(worst.get('eps')):g}: {worst.get('kernel')} {worst.get('dtype')})", fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, handles, verdicts)
    return _save(fig, Path(path))


# ---------------------------------------------------------------------------------- error vs log-decay
def plot_error_vs_log_decay(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path | None:
    """cond_max against the decay strength of the gated families' ``uniform_decay`` cases (-decay_floor,
    the largest per-step |log-decay|, log x), one line per kernel x chunk size x dtype."""
    recs = [r for r in _ordered(records)
            if r.get("decay_floor") is not None and _num(r.get("decay_floor")) < 0 and _positive(r.get("cond_max"))
            and math.isfinite(_num(r.get("cond_max")))]
    if not recs:
        return None
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in recs:
        chunk = f" c={r.get('chunk_size')}" if r.get("chunk_size") is not None else ""
        series.setdefault((f"{r.get('kernel')}{chunk}", str(r.get("dtype"))), []).append(r)
    fig, ax = _new_figure()
    handles, verdicts = _plot_cond_series(ax, series, lambda r: _on_log_axis(-_num(r.get("decay_floor"))))
    _log_scale(ax, "x", "log")
    _log_scale(ax, "y", "log")
    ax.set_xlabel("decay strength: largest per-step |log-decay| (g uniform in [-x, 0])")
    ax.set_ylabel("condition-normalized error (cond_max)")
    worst = max(recs, key=lambda r: _num(r.get("cond_max")))
    dropped = sum(1 for r in records if r.get("decay_floor") is not None and not (
        _positive(r.get("cond_max")) and math.isfinite(_num(r.get("cond_max")))))
    ax.set_title(f"gated decay: error against log-decay (worst {_num(worst.get('cond_max')):.3g}: {worst.get('kernel')} "
                 f"{worst.get('dtype')} at {_num(worst.get('decay_floor')):g}"
                 + (f"; {dropped} non-finite or error records not drawn)" if dropped else ")"),
                 fontsize="medium", wrap=True)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, handles, verdicts)
    return _save(fig, Path(path))


# -------------------------------------------------------------------------------------------- onset
def plot_onset(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path | None:
    """onset_t (the first mismatched position) against length; None when no record has an onset."""
    recs = [r for r in _ordered(records)
            if _positive(r.get("length")) and math.isfinite(_num(r.get("onset_t"))) and _num(r.get("onset_t")) >= 0]
    if not recs:
        return None
    fig, ax = _new_figure()
    series = _by_series(recs)
    handles, verdicts = [], set()
    from matplotlib.lines import Line2D

    for i, (key, rs) in enumerate(sorted(series.items())):
        style = _style(i)
        by_verdict: dict[str, list[Mapping[str, Any]]] = {}
        for r in rs:
            by_verdict.setdefault(str(r.get("verdict")), []).append(r)
        for v, vr in sorted(by_verdict.items()):
            verdicts.add(v)
            ax.scatter([_num(r.get("length")) for r in vr], [_num(r.get("onset_t")) for r in vr],
                       marker=VERDICT_MARKERS.get(v, "o"), color=style["color"], s=28, zorder=3)
        handles.append(Line2D([], [], color=style["color"], marker="o", linestyle="none", label=f"{key[0]} {key[1]}"))
    lengths = sorted({_num(r.get("length")) for r in recs})
    ends = [lengths[0] / 1.5, *lengths, lengths[-1] * 1.5]
    ax.plot(ends, [L - 1 for L in ends], color="0.5", linestyle="--", linewidth=1.0)
    ax.annotate("end of sequence (t = L - 1)", xy=(ends[-1], ends[-1] - 1), fontsize="small", color="0.3",
                ha="right", va="top")
    _log_scale(ax, "x", "log", base=2)
    _log_scale(ax, "y", "symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)  # a position: the symlog margin below t = 0 drew ticks at -1 and -10
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("onset_t: first mismatched position")
    first = min(recs, key=lambda r: (_num(r.get("onset_t")) / max(_num(r.get("length")), 1.0)))
    ax.set_title(f"Onset of mismatch: {len(recs)} cases; earliest relative onset t={int(_num(first.get('onset_t')))} "
                 f"of L={int(_num(first.get('length')))} ({first.get('kernel')} {first.get('dtype')})",
                 fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, handles, verdicts)
    return _save(fig, Path(path))


# ----------------------------------------------------------------------------------------- one case
#: Failing cases drawn per report, the worst of each kind of failure; the rest are in failures.csv without one.
MAX_CASE_FIGURES = 12

#: The problem fields a record carries (`harness.problems.Problem`), from which its case is replayed.
def _problem_fields() -> tuple[str, ...]:
    import dataclasses

    from harness.problems import Problem

    return tuple(f.name for f in dataclasses.fields(Problem) if f.name != "values")


def oracle_state_series(record: Mapping[str, Any]) -> tuple[Any, Any] | str:
    """The float64 oracle's state magnitude along the sequence for ``record``'s case, or why not.

    Returns ``(state_peak, decay_peak)``, two float64 numpy arrays of length L: at each t, the largest
    running peak over the output's rows of |state| and of the products of decays a parallel scan forms
    (`reference_impls.trace.Trace`). The record stores only their maxima, so the case is replayed from
    its problem fields and seed: inputs and oracle only, no kernel, so it costs one oracle call. The
    replayed problem must hash to the record's ``case`` (the same inputs), else the reason is returned.
    """
    import torch

    from harness.errors import HarnessError
    from harness.problems import Problem
    from harness.runner import reference_trace

    if record.get("explicit_values"):
        return "the case's explicit input values are not stored in the record"
    if "pair" in record:
        return "a pair of kernels (each kernel's own case has the figure)"
    try:
        problem = Problem.from_dict({k: record[k] for k in _problem_fields() if k in record})
    except (HarnessError, TypeError, ValueError) as exc:
        return f"the record's problem cannot be rebuilt: {exc}"
    if record.get("case") is not None and problem.key != record.get("case"):
        return "the record's problem does not reproduce its case (another harness version?)"
    from harness.kernels import registry
    from harness.kernels.contract import RETNET

    try:
        convention = registry.get(str(record.get("kernel"))).convention
    except HarnessError:
        if problem.definition.has_convention:
            return "the kernel is not registered here, so its retention convention is unknown"
        convention = RETNET  # scans have no convention
    inputs = problem.replace(device="cpu").make_inputs()
    trace = reference_trace(problem, inputs, convention)
    la = problem.length_axis % trace.out.ndim

    def per_t(t: torch.Tensor) -> Any:
        return t.movedim(la, -1).reshape(-1, t.shape[la]).amax(dim=0).numpy()

    return per_t(trace.state_peak.abs()), per_t(trace.decay_peak.abs())


def plot_case(record: Mapping[str, Any], path: str | os.PathLike) -> Path | None:
    """One case along the sequence: is the error rounding, a jump, or the state leaving the range?

    Top: the error in units of its bound (the record's ``error_by_position``: the max cond error over
    the rows, in windows ending at each stored t; every t up to L = 64), with the bound (cond = 1), the
    first mismatch (``onset_t``) and the first NaN/Inf in domain (``first_nonfinite_t``) marked, and the
    chunk boundaries when the case has a chunk size. Bottom: the float64 oracle's state (and decay
    product) peak against the dtype's largest finite value, with the first position out of domain
    (``domain_onset_t``) marked (`oracle_state_series`). None when the record has no error series.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from harness import dtypes

    series = [(int(t), _num(e)) for t, e in (record.get("error_by_position") or [])]
    if not series:
        return None
    length = int(_num(record.get("length"))) if _positive(record.get("length")) else series[-1][0] + 1
    fig = Figure(figsize=(8.5, 6.5), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})

    ts = [t for t, _ in series]
    finite = [(t, _on_log_axis(e)) for t, e in series if math.isfinite(e) and e > 0]
    floor = min((e for _, e in finite), default=1e-3) / 10
    tops = [e for _, e in finite] + [1.0]
    top = max(tops) * 10
    if finite:
        ax.plot([t for t, _ in finite], [e for _, e in finite], color="tab:blue", marker=".", markersize=4,
                linewidth=1.2, label="max cond error at t (error / its bound)")
    nonfinite = [t for t, e in series if math.isinf(e)]
    if nonfinite:
        ax.scatter(nonfinite, [top / 3] * len(nonfinite), marker="x", color="tab:red", zorder=3,
                   label="NaN/Inf where the oracle is in domain")
    gaps = [t for t, e in series if math.isnan(e)]
    if gaps:
        ax.scatter(gaps, [floor] * len(gaps), marker="|", color="0.5", zorder=3,
                   label="nothing compared (out of domain)")
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1.0, label="rounding bound (cond = 1)")
    marks = [("onset_t", "first mismatch", "tab:orange"), ("first_nonfinite_t", "first NaN/Inf in domain", "tab:red"),
             ("domain_onset_t", "out of domain", "tab:purple")]
    for key, label, color in marks:
        if math.isfinite(_num(record.get(key))):
            t0 = _num(record.get(key))
            for a in (ax, ax2):
                a.axvline(t0, color=color, linestyle=":", linewidth=1.4,
                          label=f"{label} (t={int(t0)})" if a is ax else None)
    chunk = _num(record.get("chunk_size"))
    if math.isfinite(chunk) and chunk > 0 and length / chunk <= 64:
        for b in range(int(chunk), length, int(chunk)):
            ax.axvline(b - 0.5, color="0.85", linewidth=0.8, zorder=0)
        ax.annotate(f"chunk boundaries (every {int(chunk)})", xy=(0.99, 0.02), xycoords="axes fraction",
                    ha="right", fontsize="small", color="0.5")
    _log_scale(ax, "y", "log")
    ax.set_ylim(floor, top)
    ax.set_ylabel("error / bound (cond)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="x-small", framealpha=0.8)

    precision = str(record.get("precision") or record.get("dtype"))
    try:
        max_finite = dtypes.info(precision).max_finite
    except Exception:  # noqa: BLE001 - an unknown dtype name leaves the panel without its line
        max_finite = math.nan
    state = oracle_state_series(record)
    if isinstance(state, str):
        ax2.text(0.5, 0.5, f"oracle state not drawn: {state}", ha="center", va="center", transform=ax2.transAxes,
                 fontsize="small", color="0.3", wrap=True)
        ax2.set_yticks([])
    else:
        import numpy as np

        # in units of the dtype's largest finite value, so that float64's 1.8e308 stays on a log axis
        scale = max_finite if math.isfinite(max_finite) else 1.0
        t_all = np.arange(len(state[0]))
        shown = []
        for values, label, color in ((state[0], "oracle |state|, running peak", "tab:green"),
                                     (state[1], "product of decays, running peak", "tab:olive")):
            ratio = values / scale
            keep = np.isfinite(ratio) & (ratio > 0)
            if keep.any():
                drawn = np.clip(ratio[keep], *LOG_AXIS_RANGE)
                ax2.plot(t_all[keep], drawn, color=color, linewidth=1.2, label=label)
                shown.append(drawn)
        ax2.axhline(1.0, color="tab:red", linestyle="--", linewidth=1.0,
                    label=f"{precision} max ({max_finite:.3g})" if math.isfinite(max_finite) else "1")
        low = min((float(r.min()) for r in shown), default=1e-3)
        high = max((float(r.max()) for r in shown), default=1.0)
        _log_scale(ax2, "y", "log")
        ax2.set_ylim(low / 10, max(high, 1.0) * 10)
        ax2.legend(loc="upper left", fontsize="x-small", framealpha=0.8)
        ax2.grid(True, which="major", alpha=0.3)
    ax2.set_ylabel(f"magnitude / {precision} max")
    ax2.set_xlabel("position t along the sequence")
    ax2.set_xlim(-0.5 if length <= 64 else 0, max(length - 0.5, ts[-1] + 0.5))
    if length > 64:
        _log_scale(ax2, "x", "symlog", linthresh=8)

    where = " ".join(f"{k}={record.get(k)}" for k in ("dtype", "length", "regime", "eps", "chunk_size")
                     if record.get(k) is not None)
    fig.suptitle(f"{record.get('kernel')}: {record.get('verdict')} ({record.get('cause')}), {where}\n"
                 f"{_case_message(record)}", fontsize=9)
    # a fixed layout: one draw instead of bbox_inches="tight"'s two (12 figures a report)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.89, bottom=0.08, hspace=0.08)
    fig.savefig(Path(path), format="png", dpi=_DPI, metadata={"Software": None})
    return Path(path)


def _case_message(record: Mapping[str, Any]) -> str:
    """The figure's one message: where the error starts and what it follows."""
    onset, nf, dom = (_num(record.get(k)) for k in ("onset_t", "first_nonfinite_t", "domain_onset_t"))
    cond = _num(record.get("cond_max"))
    parts = []
    if math.isfinite(dom):  # what the record's domain cause says, not always the range (session 24)
        from harness.findings import DOMAIN_PHRASES

        cause = str(record.get("domain_cause") or "")
        parts.append(f"out of domain from t={int(dom)}: {DOMAIN_PHRASES.get(cause, 'the inputs leave the dtype range')}")
    if math.isfinite(onset):
        parts.append(f"first mismatch at t={int(onset)}")
    if math.isfinite(nf):
        parts.append(f"first NaN/Inf in domain at t={int(nf)}")
    if math.isfinite(cond):
        parts.append(f"max cond error {cond:.3g}")
    return "; ".join(parts) or str(record.get("why") or "")[:100]


def case_figure_name(record: Mapping[str, Any]) -> str:
    """``case_<kernel>_<case>.png``: fixed by the record, so the same records give the same names."""
    return f"case_{_safe(str(record.get('kernel')))}_{_safe(str(record.get('case')))}.png"


def write_case_figures(failing: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike, *,
                       limit: int = MAX_CASE_FIGURES) -> dict[str, Path]:
    """`plot_case` for the worst record of each kind of failure in ``failing`` (worst first; pairs
    skipped), up to ``limit`` figures; {name: path}.

    A kind is a kernel x dtype x verdict x cause (a gradient is a kernel of its own): a failing search's
    records are its case and the shrinker's smaller copies of it, and drawing twelve of them cost about
    7 s a report for one picture repeated. Every other case is in the failing-cases table with its replay.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    seen: set[tuple] = set()
    for record in failing:
        if len(written) >= limit:
            break
        key = tuple(str(record.get(k)) for k in ("kernel", "dtype", "verdict", "cause"))
        if "pair" in record or key in seen:
            continue
        seen.add(key)
        path = _drawn(plot_case, record, out / case_figure_name(record))
        if path is not None:
            written[case_figure_name(record)] = path
    return written


# ---------------------------------------------------------------------------------------------- all
class FigureNotDrawn(UserWarning):
    """A figure failed to draw; the report is written without it (its tables hold every number)."""


def _drawn(plot: Callable[..., Path | None], *args: Any) -> Path | None:
    """``plot(*args)``, or None with a `FigureNotDrawn` warning when drawing raises: a figure is an aid
    to the tables, and a report that crashes on one loses the measurements of the whole run."""
    import warnings

    try:
        return plot(*args)
    except Exception as exc:  # noqa: BLE001 - any plotting failure: the report goes on without the figure
        warnings.warn(f"{Path(args[-1]).name} not drawn: {type(exc).__name__}: {exc}", FigureNotDrawn, stacklevel=2)
        return None


def write_plots(records: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike) -> list[Path]:
    """Write every figure that has data into ``out_dir``; return their paths (sorted by name)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    families = sorted({str(r.get("family")) for r in records if r.get("family") is not None})
    for family in families:
        p = _drawn(plot_error_vs_length, records, family, out / f"plot_error_vs_length_{_safe(family)}.png")
        if p is not None:
            written.append(p)
    for p in (_drawn(plot_error_vs_eps, records, out / "plot_error_vs_eps.png"),
              _drawn(plot_onset, records, out / "plot_onset.png"),
              _drawn(plot_error_vs_log_decay, records, out / "plot_error_vs_log_decay.png")):
        if p is not None:
            written.append(p)
    return sorted(written, key=lambda p: p.name)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
