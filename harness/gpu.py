"""The CUDA path: whether a GPU is usable here, the devices to test, the TF32 axis, run-to-run determinism.

Cases run on a GPU exactly as on the CPU (`harness.runner.run_case`): inputs are drawn in float64 on the
CPU, rounded once to the case's dtype and copied to the device (`Problem.make_inputs`); the oracle runs
in float64 on the CPU from those same rounded values (`harness.runner.reference_trace` moves them back);
the kernel's output is read back to the CPU and measured there. Nothing here changes that flow; this
module holds what only the GPU path needs:

- `cuda_available`: None when a CUDA device is usable, else the one-line reason (what tests skip with);
  `devices_to_test`: ``["cpu"]`` plus ``"cuda"`` when it is usable.
- The TF32 axis. On Ampere and later GPUs a float32 matmul may run on tensor cores with a 10-bit
  fraction (TF32, unit roundoff ``2**-11`` instead of ``2**-24``). A `Problem` with ``tf32=True`` runs
  its kernel under ``tf32_settings(True)`` and is measured against TF32's unit roundoff
  (``harness.dtypes.unit_roundoff("float32", tf32=True)``); ``tf32=False`` runs under
  ``tf32_settings(False)`` and is held to float32's. `round_to_tf32` rounds float32 values onto the
  TF32 grid, a CPU stand-in for what a tensor core does to a matmul's inputs.
- `determinism_check`: the kernel called several times on the same inputs on the device, compared bit
  for bit (atomics and split-K reductions make some GPU kernels differ from run to run).

`describe_environment` gives the lines `scripts/gpu_check.sh` prints (torch, CUDA, cuDNN, device).
`device_health` and `is_sticky_error` tell a run when the device can no longer be trusted: an
illegal address or a device-side assert poisons the CUDA context of the process, and every later
call on it fails (or hangs) whatever the kernel, so a sweep stops there with that error.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Iterator

import torch

from harness import dtypes
from harness.errors import InvalidArgument
from harness.kernels.contract import KernelSpec, on_device
from harness.kernels.guard import DEFAULT_TIMEOUT_S, call_guarded
from harness.problems import Problem

__all__ = [
    "cuda_available",
    "describe_environment",
    "determinism_check",
    "device_health",
    "devices_to_test",
    "is_sticky_error",
    "restore_tf32_state",
    "round_to_tf32",
    "tf32_settings",
    "tf32_state",
    "tf32_supported",
]


# ---------------------------------------------------------------------------------------- the device
def cuda_available() -> str | None:
    """None when a CUDA device is usable here, else one line saying why not.

    "Usable" means ``torch.cuda.is_available()`` and a one-element tensor can be made and written on
    the device (a visible but broken device, e.g. a driver/runtime mismatch, gives its error).
    """
    version = torch.__version__
    if not torch.cuda.is_available():
        return f"no CUDA device: torch.cuda.is_available() is False (torch {version})"
    try:
        torch.zeros(1, device="cuda").add_(1.0)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not usable", with its reason
        text = " ".join(str(exc).split())[:200]
        return f"CUDA device present but unusable: {type(exc).__name__}: {text} (torch {version})"
    return None


#: Words of the CUDA errors after which the context is unusable (cudaErrorIllegalAddress, ...LaunchFailure,
#: ...Assert, ...IllegalInstruction, ...MisalignedAddress, ...HardwareStackError, ...ECCUncorrectable).
STICKY_ERROR_MARKERS = (
    "illegal memory access", "illegal address", "unspecified launch failure", "device-side assert",
    "illegal instruction", "misaligned address", "hardware stack error", "uncorrectable ecc",
    "cudaerrorillegaladdress", "cudaerrorlaunchfailure", "cudaerrorassert",
)


def is_sticky_error(message: str | None) -> bool:
    """Whether ``message`` (a kernel error's text) names a CUDA error that poisons the context."""
    text = (message or "").lower()
    return any(marker in text for marker in STICKY_ERROR_MARKERS)


def device_health(device: str | torch.device, timeout_s: float = 15.0) -> str | None:
    """None when ``device`` still computes (a small op and a synchronize finish in ``timeout_s``), else why not.

    Asked after a kernel raised or timed out on a GPU: after a sticky error the probe raises the same
    error again; on a hung device it does not finish. The probe runs on a daemon thread, so a hang
    costs ``timeout_s``, not the run. On the CPU it answers None at once.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    box: dict[str, Any] = {}

    def probe() -> None:
        try:
            with torch.cuda.device(device):
                value = torch.ones(4, device=device).add_(1.0).sum()
                torch.cuda.synchronize(device)
                box["value"] = float(value)
        except BaseException as exc:  # noqa: BLE001 - the error is the answer
            box["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

    thread = threading.Thread(target=probe, name="harness-device-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"{device} did not finish a 4-element add and synchronize within {timeout_s:g} s (hung)"
    if "error" in box:
        return f"{device} fails a 4-element add: {box['error']}"
    if box.get("value") != 8.0:
        return f"{device} computed 4 x (1 + 1) = {box.get('value')!r}, not 8"
    return None


def devices_to_test() -> list[str]:
    """``["cpu"]``, plus ``"cuda"`` when `cuda_available` says a device is usable."""
    return ["cpu"] + (["cuda"] if cuda_available() is None else [])


def tf32_supported() -> str | None:
    """None when CUDA float32 matmuls can run in TF32 here (compute capability >= 8.0), else why not."""
    reason = cuda_available()
    if reason is not None:
        return reason
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return (f"{torch.cuda.get_device_name()} is sm_{major}{minor}: TF32 needs compute capability 8.0 "
                f"(Ampere) or later, so the TF32 flags change nothing there")
    return None


def describe_environment() -> list[str]:
    """Lines describing torch, CUDA, cuDNN and the device (what `scripts/gpu_check.sh` prints)."""
    lines = [f"torch {torch.__version__}", f"torch.version.cuda {torch.version.cuda}"]
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - a broken cuDNN install is reported, not raised
        cudnn = None
    lines.append(f"cudnn {cudnn}")
    reason = cuda_available()
    if reason is not None:
        lines.append(reason)
        return lines
    lines.append(f"devices {torch.cuda.device_count()}")
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f"cuda:{i} {props.name}, sm_{props.major}{props.minor}, "
                     f"{props.total_memory / 2**30:.1f} GiB")
    tf32 = tf32_supported()
    lines.append("tf32 supported" if tf32 is None else f"tf32 not supported: {tf32}")
    return lines


# ------------------------------------------------------------------------------------------ the TF32 axis
def _fp32_precision_knobs() -> dict[str, Any]:
    """The objects carrying torch's ``fp32_precision`` (torch >= 2.9), by name.

    The generic and per-backend levels (an operator's "none" inherits from its backend's, which
    inherits from the generic one), then the operators TF32 concerns. Older torch has none of them.
    """
    knobs: dict[str, Any] = {}
    candidates = (  # the inherited-from levels first, so that restoring them cannot undo the others
        ("generic", lambda: torch.backends),
        ("cudnn", lambda: torch.backends.cudnn),
        ("mkldnn", lambda: torch.backends.mkldnn),
        ("cuda.matmul", lambda: torch.backends.cuda.matmul),
        ("cudnn.conv", lambda: torch.backends.cudnn.conv),
        ("cudnn.rnn", lambda: torch.backends.cudnn.rnn),
        ("mkldnn.matmul", lambda: torch.backends.mkldnn.matmul),
    )
    for name, get in candidates:
        try:
            obj = get()
            obj.fp32_precision  # noqa: B018 - probing that the attribute exists
        except (AttributeError, RuntimeError):
            continue
        knobs[name] = obj
    return knobs


def _read(get: Callable[[], Any]) -> Any:
    """A flag's value, or the text of the error reading it raises.

    torch >= 2.9 raises RuntimeError from the legacy getters (``matmul.allow_tf32``,
    ``get_float32_matmul_precision()``, ``cudnn.allow_tf32``) once the new ``fp32_precision`` API has
    set a value the legacy flag cannot express ("mix of the legacy and new APIs").
    """
    try:
        return get()
    except RuntimeError as exc:
        return f"unreadable: {' '.join(str(exc).split())[:80]}"


def tf32_state() -> dict[str, Any]:
    """Every flag that decides whether float32 matmuls and convolutions may use TF32, by name.

    The legacy flags (``matmul.allow_tf32``, ``float32_matmul_precision``, ``cudnn.allow_tf32``) and, on
    torch >= 2.9, the per-backend ``fp32_precision`` values. A legacy flag that torch refuses to read
    (see `_read`) holds the text ``"unreadable: ..."``. Two equal states mean equal TF32 behaviour.
    """
    state: dict[str, Any] = {
        "matmul.allow_tf32": _read(lambda: torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "cudnn.allow_tf32": _read(lambda: torch.backends.cudnn.allow_tf32),
    }
    for name, obj in _fp32_precision_knobs().items():
        state[f"{name}.fp32_precision"] = obj.fp32_precision
    return state


def _legacy_precision(saved: dict[str, Any]) -> str:
    """The legacy ``float32_matmul_precision`` torch held when ``saved`` was taken, even if unreadable then.

    torch keeps it beside the per-backend values; its getter refuses to answer when they disagree
    (Context::float32MatmulPrecision: cuda.matmul "tf32" needs not "highest", mkldnn.matmul "bf16"
    needs "medium", "tf32" needs "high"), and ``matmul.allow_tf32`` reads ``precision != "highest"``
    (refusing when that disagrees with cuda.matmul == "tf32"). A refusal therefore tells the value.
    """
    precision = saved["float32_matmul_precision"]
    if isinstance(precision, str) and not precision.startswith("unreadable"):
        return precision
    allow = saved["matmul.allow_tf32"]
    if not isinstance(allow, bool):  # refused: the legacy flag disagrees with cuda.matmul
        allow = saved.get("cuda.matmul.fp32_precision") != "tf32"
    if not allow:
        return "highest"
    # not "highest", and the getter refused: the mkldnn value disagrees with it
    return "high" if saved.get("mkldnn.matmul.fp32_precision") == "bf16" else "medium"


def restore_tf32_state(saved: dict[str, Any]) -> None:
    """Put back a state `tf32_state` returned: the legacy values first, then the per-backend ones.

    Afterwards `tf32_state` reads the same again, including which legacy getters torch refuses to
    read. (A per-backend value that was inheriting, e.g. from ``torch.backends.fp32_precision``, is
    put back as the value it resolved to: torch offers no getter for the unresolved one.)
    """
    torch.set_float32_matmul_precision(_legacy_precision(saved))
    cudnn = saved["cudnn.allow_tf32"]
    knobs = _fp32_precision_knobs()
    if isinstance(cudnn, bool):
        torch.backends.cudnn.allow_tf32 = cudnn
    elif "cudnn.conv.fp32_precision" in saved:  # refused: the legacy flag disagrees with the conv value
        torch.backends.cudnn.allow_tf32 = saved["cudnn.conv.fp32_precision"] != "tf32"
    # torch >= 2.9: the legacy setters above also wrote the per-backend values; put those back as saved
    for name, obj in knobs.items():
        obj.fp32_precision = saved[f"{name}.fp32_precision"]


@contextlib.contextmanager
def tf32_settings(enabled: bool = True) -> Iterator[None]:
    """TF32 on (``enabled``) or off for float32 matmuls and cuDNN convolutions; everything restored after.

    Sets ``torch.set_float32_matmul_precision("high" | "highest")``, ``torch.backends.cuda.matmul.
    allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (in that order, so the legacy and new torch
    APIs agree inside the block and every getter can be read there), and on exit puts back the exact
    state `tf32_state` saw, through the per-backend ``fp32_precision`` values on torch >= 2.9.

    The flags are process globals, so this works (and is testable) on a CPU-only build, where it
    changes nothing that runs on the CUDA side. ``float32_matmul_precision`` also reaches oneDNN's
    CPU matmuls, which use TF32 only on hardware that has it (x86 CPUs without such units keep
    float32); the float64 oracle is never affected.
    """
    if not isinstance(enabled, bool):
        raise InvalidArgument(f"enabled={enabled!r} must be True or False")
    saved = tf32_state()
    try:
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        # the legacy cuDNN setter writes "none" (inherit) when disabling, which a generic "tf32" would
        # override; name the per-operator values so the legacy and new views agree inside the block
        for name, obj in _fp32_precision_knobs().items():
            if name.startswith("cudnn."):
                obj.fp32_precision = "tf32" if enabled else "ieee"
        yield
    finally:
        restore_tf32_state(saved)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded onto the TF32 grid (10 fraction bits, float32's exponent), as float32.

    Round to nearest, ties away from zero, as the tensor cores' ``cvt.rna.tf32.f32`` does; NaN and
    +-Inf are kept; a value that rounds past float32's largest finite becomes Inf. A CPU stand-in for
    what TF32 does to a matmul's inputs, e.g. to check that the TF32 axis judges such error equivalent.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise InvalidArgument(f"x must be a float32 tensor; got {getattr(x, 'dtype', type(x).__name__)}")
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


# ------------------------------------------------------------------------------------------ determinism
def _run_to_run(first: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(mask of the elements whose bit patterns differ, the largest |difference| among them in float64).

    NaN against NaN and +0 against -0 count as 0 difference (they still differ in bits); NaN against a
    number is an infinite difference.
    """
    view = dtypes.info(first.dtype).int_view
    differ = first.contiguous().view(view) != other.contiguous().view(view)
    if not bool(differ.any()):
        return differ, 0.0
    a = first[differ].to("cpu", torch.float64)
    b = other[differ].to("cpu", torch.float64)
    d = torch.where((torch.isnan(a) & torch.isnan(b)) | (a == b), 0.0, (a - b).abs())
    return differ, float(d.nan_to_num(nan=math.inf).max())


def determinism_check(spec: KernelSpec, problem: Problem, repeats: int = 2, *, kernel_fn: Callable | None = None,
                      timeout_s: float | None = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Call ``spec``'s kernel ``repeats`` times on the same inputs on ``problem.device``; compare bit for bit.

    Each call goes through `harness.kernels.guard.call_guarded` (contract checks and timeout), under
    ``tf32_settings(problem.tf32)``. Returns a record fragment::

        {"kernel", "deterministic", "max_run_to_run_diff", "n_differing", "repeats", "case", "family",
         "device", "dtype", "tf32", "length", "chunk_size", "outcome", "error"}

    ``deterministic`` is True when every call's output has the first call's bit pattern, False when
    one differs (``max_run_to_run_diff``: the largest |difference| against the first call, float64;
    ``n_differing``: elements that differ in any call), and None when a call failed its contract
    (``outcome`` and ``error`` say which call and how); the kernel then is a ``kernel_error`` case,
    which `harness.runner.run_case` reports, not a determinism finding.
    """
    from harness.runner import call_args, output_shape

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 2:
        raise InvalidArgument(f"repeats={repeats!r} must be an integer >= 2; one call has nothing to compare with")
    record: dict[str, Any] = {
        "kernel": spec.name, "family": problem.family.value, "case": problem.key, "device": problem.device,
        "dtype": problem.dtype, "tf32": problem.tf32, "length": problem.length, "chunk_size": problem.chunk_size,
        "repeats": repeats, "deterministic": None, "max_run_to_run_diff": math.nan, "n_differing": 0,
        "outcome": "ok", "error": None,
    }
    fn = on_device(kernel_fn) if kernel_fn is not None else spec.callable()
    inputs = problem.make_inputs()
    args, kwargs = call_args(problem, inputs)
    device = next(iter(inputs.values())).device
    outputs: list[torch.Tensor] = []
    with tf32_settings(problem.tf32), torch.no_grad():
        for i in range(repeats):
            result = call_guarded(fn, args, kwargs, expected_shape=output_shape(problem),
                                  expected_dtype=problem.torch_dtype, expected_device=device, timeout_s=timeout_s)
            if not result.ok:
                record["outcome"] = result.outcome.value
                record["error"] = f"call {i + 1} of {repeats}: {result.message}"
                return record
            outputs.append(result.output.detach())
    worst, differing = 0.0, torch.zeros_like(outputs[0], dtype=torch.bool)
    for other in outputs[1:]:
        mask, diff = _run_to_run(outputs[0], other)
        worst, differing = max(worst, diff), differing | mask
    record["n_differing"] = int(differing.sum())
    record["deterministic"] = record["n_differing"] == 0
    record["max_run_to_run_diff"] = worst
    return record
