"""Adapters for mamba-ssm (``pip install mamba-ssm``, https://github.com/state-spaces/mamba).

mamba-ssm builds a CUDA extension (``selective_scan_cuda``) at install time; built without it
(``MAMBA_SKIP_CUDA_BUILD=TRUE``: `make install-mamba-ssm`, or `make device-bundle`'s folder) its package
``__init__`` cannot be imported (it imports the extension and the model classes), but its Triton kernels
need none of that: they are imported with the package entered through its path
(`harness.kernels.contract.import_skipping_init`; nothing installed is modified). On a machine without
CUDA they run under the corrected Triton interpreter (`harness.kernels.triton_interpreter`; among its
corrections ``cuda_device_none_noop`` and ``cuda_device_properties_h100``, for mamba-ssm's launchers,
which enter ``torch.cuda.device(x.device.index)`` and size the SSD backward grid from the device's
multiprocessor count); `import_triton_module` turns the interpreter on first and checks that every kernel
of the module was interpreted.

selective_scan family:

- ``mamba_ssm.selective_scan_fn`` (CUDA only): ``selective_scan_fn(u, delta, A, B, C, D, z, delta_bias,
  delta_softplus)`` *is* our selective_scan contract (same names, layouts and meaning). The CUDA kernel takes
  inputs in float32, float16 or bfloat16 (no float64), ``A``, ``D`` and ``delta_bias`` in float32 only (its
  ``TORCH_CHECK``s), and N <= 256. The adapter upcasts A, D and delta_bias to float32 (exact from any of the
  three input dtypes) and passes the rest as given, as ``mamba_ssm.modules.mamba_simple.Mamba`` does.
  Unavailable, with the reason, where the extension was not built.
- ``mamba_ssm.selective_state_update``: the Triton single-step kernel
  ``mamba_ssm.ops.triton.selective_state_update.selective_state_update(state, x, dt, A, B, C, D, z,
  dt_bias, dt_softplus)``, called once per step by the adapter on a zero state that the adapter owns
  (the kernel updates it in place: that is its API). Ungrouped B/C use the 3-D form (state (batch, dim,
  N)); grouped B/C (batch, G, N, L) use the multi-head form of mamba-ssm >= 2 with ``nheads = G``,
  ``headdim = dim // G``. The state is kept in the input dtype, as ``Mamba.allocate_inference_cache``
  does by default; the kernel computes each step in float32. A case without ``D`` or ``delta_bias``
  passes zeros (float32), never None: mamba-ssm 2.x launches the kernel with
  ``*(dt_bias.stride(0), dt_bias.stride(1)) if dt_bias is not None else 0``, which unpacks ``0`` and
  raises TypeError for None (the same for D). Adding a zero bias and a zero skip is exact, so the
  kernel computes the same function as without them. Its float32 softplus is ``log(exp(dt) + 1)``
  (``ops/triton/softplus.py`` on Triton >= 3), not ``log1p``: found divergent in float32 with
  ``delta_softplus`` (docs/adapters.md; tests/test_adapters.py shows the finding goes with an accurate
  softplus).

ssd family (Mamba-2), in mamba-ssm's layout ``fn(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
dt_softplus=False, initial_states=None, seq_idx=None, return_final_states=False)``: x (batch, T, heads, P),
dt (batch, T, heads), A (heads,), B, C (batch, T, groups, N):

- ``mamba_ssm.mamba_chunk_scan_combined`` (and ``.ieee``): the Triton forward and backward kernels of
  ``ops/triton/ssd_combined.py``, given everything as is (dt bias, softplus, grouping, ``seq_idx`` and the
  initial/final states are the kernel's); seq_idx handed over as int32 (mamba-ssm's dtype). Its float32
  ``tl.dot`` calls name no ``input_precision``: TF32 on sm_80+ GPUs and in the interpreter, so float32 is
  declared ``tf32_rz``; the ``.ieee`` twin runs forward and backward with ieee dots
  (`triton_interpreter.call_in_dot_precision`).
- ``mamba_ssm.ssd_chunk_scan_combined_ref``: mamba-ssm's pure-PyTorch chunked reference (``chunk_state_ref``,
  ``state_passing_ref``, ``chunk_scan_ref``): no initial states, seq_idx or final states; lengths a multiple of
  the chunk.
- ``mamba_ssm.ssd_minimal_discrete``: Listing 1 of the Mamba-2 paper (``modules/ssd_minimal.py``), pure
  PyTorch in the input dtype. It takes the discretized ``X = x dt`` and ``A dt`` and B, C per head, so the
  adapter forms those (one rounding each, in the input dtype) and repeats the groups; no D, z, dt_bias,
  softplus or seq_idx (``selective_options=False``), no dt clamp, lengths a multiple of the chunk.
"""

from __future__ import annotations

import functools
import importlib.machinery
from typing import Callable, Sequence

import torch

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels import triton_interpreter
from harness.kernels.contract import (
    ALL_DTYPES,
    Capabilities,
    Lengths,
    Family,
    KernelSpec,
    import_skipping_init,
    require_cuda,
    require_module,
)

_TAKES_NEGATIVE_STEPS = {"negative_steps": "a negative step is used as given (no dt_limit clamp), where "
                                            "mamba_chunk_scan_combined clamps it to 0"}


__all__ = ["KERNELS", "state_update_scan"]

PACKAGE = "mamba-ssm"
EXTENSION = "selective_scan_cuda"


def _copy(t: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """A fresh contiguous copy (optionally upcast): the package never gets the harness's own tensors."""
    if t is None:
        return None
    return t.to(dtype=dtype or t.dtype, memory_format=torch.contiguous_format, copy=True)


def _import(module: str, *, extension: str | None = None):
    """``module`` from mamba-ssm, then CUDA; the reason names both when both are missing.

    When the plain import fails but the package is on ``sys.path`` (a build without its CUDA
    extension, whose ``__init__`` cannot import), ``module`` is imported without the package's
    ``__init__``, unless it needs ``extension`` and that was not built.
    """
    try:
        mod = require_module(module, package=PACKAGE)
    except KernelUnavailable as exc:
        mod = _import_without_package_init(module, extension, exc.reason)
    require_cuda()
    return mod


def _import_without_package_init(module: str, extension: str | None, failed: str,
                                 path: Sequence[str] | None = None):
    if importlib.machinery.PathFinder.find_spec("mamba_ssm", None if path is None else list(path)) is None:
        if torch.cuda.is_available():
            raise KernelUnavailable(failed)
        raise KernelUnavailable(f"{failed}; it would not run here anyway: mamba-ssm builds CUDA extensions at "
                                "install time and its kernels need a CUDA device, and this machine has none")
    if extension is not None and importlib.machinery.PathFinder.find_spec(extension) is None:
        raise KernelUnavailable(f"mamba-ssm is installed without its CUDA extension {extension!r} (a build with "
                                f"MAMBA_SKIP_CUDA_BUILD=TRUE, such as `make device-bundle`'s); {module} needs it")
    try:
        return import_skipping_init(module, path=path)
    except Exception as exc:  # noqa: BLE001 - any failure here is a reason, not a crash
        raise KernelUnavailable(f"{failed}; imported without the package's __init__ it failed too: "
                                f"{type(exc).__name__}: {exc}") from None


def _load_selective_scan_fn() -> Callable:
    fn = _import("mamba_ssm.ops.selective_scan_interface", extension=EXTENSION).selective_scan_fn
    f32 = torch.float32

    def mamba_ssm_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        y = fn(_copy(u), _copy(delta), _copy(A, f32), _copy(B), _copy(C), D=_copy(D, f32), z=_copy(z),
               delta_bias=_copy(delta_bias, f32), delta_softplus=bool(delta_softplus))
        return y.to(u.dtype)

    return mamba_ssm_selective_scan


def import_triton_module(module: str, *, path: Sequence[str] | None = None):
    """A mamba-ssm Triton module: compiled where CUDA is; on a machine without, interpreted and corrected.

    Without CUDA the interpreter is turned on before the import (`triton_interpreter.enable_interpreter`),
    the corrections are required (among them ``cuda_device_none_noop``: every mamba-ssm launcher enters
    ``torch.cuda.device(x.device.index)``), and the module is imported without the package's ``__init__``
    when that cannot import (the CUDA extension not built). Every ``@triton.jit`` kernel the module holds
    must then be interpreted. ``path``: import mamba-ssm from these folders instead of ``sys.path`` (a
    build kept apart, such as `make device-bundle`'s), always without the package's ``__init__``.
    """
    if not triton_interpreter.runs_interpreted():
        if path is not None:
            require_cuda()
            return _import_without_package_init(module, None, "mamba-ssm imported from a folder", path)
        return _import(module)
    triton_interpreter.enable_interpreter(["mamba_ssm"])
    require_module("triton")
    triton_interpreter.require_corrections()
    if path is not None:
        mod = _import_without_package_init(module, None, f"mamba-ssm is not in {list(path)}", path)
    else:
        try:
            mod = require_module(module, package=PACKAGE)
        except KernelUnavailable as exc:
            if importlib.machinery.PathFinder.find_spec("mamba_ssm") is None:
                raise KernelUnavailable(
                    "mamba-ssm is not installed; on a machine without CUDA, `make install-mamba-ssm` builds it "
                    "without its CUDA extension (MAMBA_SKIP_CUDA_BUILD=TRUE) and its Triton kernels then run here "
                    "under the corrected Triton interpreter") from None
            mod = _import_without_package_init(module, None, exc.reason)
    triton_interpreter.require_interpreted("mamba_ssm")
    compiled = triton_interpreter.compiled_kernels_of(mod)
    if compiled:
        raise KernelUnavailable(f"mamba-ssm's kernel {compiled[0]} was compiled for a GPU although the Triton "
                                "interpreter is on; set TRITON_INTERPRET=1 before starting Python")
    return mod


def _load_selective_state_update() -> Callable:
    mod = import_triton_module("mamba_ssm.ops.triton.selective_state_update")
    return state_update_scan(mod.selective_state_update)


def _load_chunk_scan_combined(precision: str | None = None, *, path: Sequence[str] | None = None) -> Callable:
    fn = import_triton_module("mamba_ssm.ops.triton.ssd_combined", path=path).mamba_chunk_scan_combined

    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                                  initial_states=None, seq_idx=None, return_final_states=False):
        x, dt, A, B, C, D, z, dt_bias, initial_states = (
            _copy(t) for t in (x, dt, A, B, C, D, z, dt_bias, initial_states))
        seq_idx = None if seq_idx is None else _copy(seq_idx, torch.int32)  # mamba-ssm's dtype; exact

        def run(x, dt, A, B, C, D, z, dt_bias, initial_states):
            return fn(x, dt, A, B, C, int(chunk_size), D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                      seq_idx=seq_idx, dt_softplus=bool(dt_softplus), return_final_states=bool(return_final_states))

        return triton_interpreter.call_in_dot_precision(precision, run, x, dt, A, B, C, D, z, dt_bias, initial_states)

    return mamba_chunk_scan_combined


def _load_chunk_scan_combined_ref(*, path: Sequence[str] | None = None) -> Callable:
    fn = import_triton_module("mamba_ssm.ops.triton.ssd_combined", path=path).ssd_chunk_scan_combined_ref

    def ssd_chunk_scan_combined_ref(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                                    **unsupported):
        _refuse(unsupported, "mamba_ssm.ssd_chunk_scan_combined_ref")
        x, dt, A, B, C, D, z, dt_bias = (_copy(t) for t in (x, dt, A, B, C, D, z, dt_bias))
        y = fn(x, dt, A, B, C, int(chunk_size), D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus))
        return y.to(x.dtype)  # float32 for float16/bfloat16 inputs (its states and sums are float32)

    return ssd_chunk_scan_combined_ref


def _load_ssd_minimal(*, path: Sequence[str] | None = None) -> Callable:
    fn = import_triton_module("mamba_ssm.modules.ssd_minimal", path=path).ssd_minimal_discrete

    def ssd_minimal_discrete(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                             initial_states=None, return_final_states=False, **unsupported):
        _refuse(unsupported, "mamba_ssm.ssd_minimal_discrete")
        for name, value in (("D", D), ("z", z), ("dt_bias", dt_bias)):
            if value is not None:
                raise InvalidArgument(f"{name} was given, but ssd_minimal_discrete takes none (declared "
                                      "selective_options=False)")
        if dt_softplus:
            raise InvalidArgument("dt_softplus=True, but ssd_minimal_discrete takes the discretized inputs (declared "
                                  "selective_options=False)")
        heads, groups = x.shape[2], B.shape[2]
        # its inputs are the discretized X = x dt and A dt, B and C per head: formed here in the input dtype
        X = x * dt[..., None]
        A_dt = dt * A.to(dt.dtype)
        Bh, Ch = (t.repeat_interleave(heads // groups, dim=2) for t in (B, C))
        h0 = None if initial_states is None else _copy(initial_states)[:, None]
        y, final = fn(X, A_dt, Bh.contiguous(), Ch.contiguous(), int(chunk_size), initial_states=h0)
        return (y, final) if return_final_states else y

    return ssd_minimal_discrete


def _refuse(unsupported: dict, name: str) -> None:
    given = sorted(k for k, v in unsupported.items() if v is not None and v is not False)
    if given:
        raise InvalidArgument(f"{name} does not take {given} (declared in its capabilities); leave them unset")


def state_update_scan(fn: Callable) -> Callable:
    """The selective_scan contract from mamba-ssm's single-step ``selective_state_update`` ``fn``.

    ``fn`` is called once per step on a zero state the adapter owns (updated in place: its API). A case
    without ``D`` or ``delta_bias`` passes float32 zeros instead of None (see the module docstring).
    """

    def mamba_ssm_state_update_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        batch, dim, length = u.shape
        n = A.shape[1]
        u, delta, A, B, C, D, z, delta_bias = (_copy(t) for t in (u, delta, A, B, C, D, z, delta_bias))
        zeros = torch.zeros(dim, dtype=torch.float32, device=u.device)
        D = zeros if D is None else D
        delta_bias = zeros.clone() if delta_bias is None else delta_bias
        if B.dim() == 3:  # (batch, N, L): the 3-D form, state (batch, dim, N)
            state = torch.zeros(batch, dim, n, dtype=u.dtype, device=u.device)
            a, d, db = A, D, delta_bias

            def per_head(t):  # (batch, dim) as is
                return t
        else:  # (batch, G, N, L): the multi-head form, nheads = G, headdim = dim // G
            g = B.shape[1]
            p = dim // g
            state = torch.zeros(batch, g, p, n, dtype=u.dtype, device=u.device)
            a, d, db = A.reshape(g, p, n), D.reshape(g, p), delta_bias.reshape(g, p)

            def per_head(t):  # (batch, dim) -> (batch, G, dim // G)
                return t.reshape(batch, g, p)
        outs = []
        for t in range(length):
            out = fn(state, per_head(u[..., t]), per_head(delta[..., t]), a, B[..., t], C[..., t], D=d,
                     z=None if z is None else per_head(z[..., t]), dt_bias=db, dt_softplus=bool(delta_softplus))
            outs.append(out.reshape(batch, dim))
        return torch.stack(outs, dim=-1).to(u.dtype)

    return mamba_ssm_state_update_scan


def _triton_unsupported(reasons: dict[str, str]) -> dict[str, str]:
    """``reasons`` plus ``"cpu"`` where the Triton kernels run compiled (CUDA present, interpreter off)."""
    cpu = triton_interpreter.cpu_unavailable_reason()
    return {**reasons, **({"cpu": cpu} if cpu else {})}


_SSD_FLOAT64 = ("mamba-ssm's SSD kernels compute in float32 (dt, its cumulative sums and the states in float32, "
                "the rest loaded .to(tl.float32))")
_SSD_TF32 = ("mamba-ssm's float32 tl.dot calls name no input_precision, so they run in TF32 on sm_80+ GPUs (and in "
             "the corrected interpreter): held to truncated TF32's rounding")


def _chunk_scan_spec(precision: str | None) -> KernelSpec:
    ieee = precision == "ieee"
    return KernelSpec(
        name="mamba_ssm.mamba_chunk_scan_combined" + (".ieee" if ieee else ""),
        family=Family.SSD,
        load=functools.partial(_load_chunk_scan_combined, precision),
        capabilities=Capabilities(
            dtypes=("float32",) if ieee else ("float32", "float16", "bfloat16"),
            devices=("cpu", "cuda"),
            chunk_sizes=(16, 32, 64),
            autograd=True,
            unsupported=_triton_unsupported({"float64": _SSD_FLOAT64}),
            slow=triton_interpreter.runs_interpreted(),
            computes_in={} if ieee else {"float32": "tf32_rz"},
            # dA's cumulative sums in float32 whatever the input (_chunk_cumsum_fwd): the chunk term is float32's
            chunk_computes_in={} if ieee else {"float16": "float32", "bfloat16": "float32"},
            matmuls=True,
            notes="Mamba-2's SSD, Triton forward and backward (mamba_ssm.ops.triton.ssd_combined); "
                  + ("float32 tl.dot run with input_precision ieee (TRITON_F32_DEFAULT=ieee)" if ieee else
                     f"float32: {_SSD_TF32}"),
            initial_state=True, final_state=True, varlen=True,
        ),
        description="mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined (Triton)"
                    + (" with float32 dots in ieee" if ieee else ""),
        source=PACKAGE,
    )


KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="mamba_ssm.selective_scan_fn",
        family=Family.SELECTIVE_SCAN,
        load=_load_selective_scan_fn,
        capabilities=Capabilities(
            dtypes=("float32", "float16", "bfloat16"),
            devices=("cuda",),
            max_state=256,
            autograd=True,
            unsupported={"float64": "selective_scan_cuda is built for float32, float16 and bfloat16 inputs only",
                         "cpu": "selective_scan_cuda is a CUDA kernel"},
            notes="A, D, delta_bias upcast to float32 (the kernel's requirement); the rest as given",
        ),
        description="mamba_ssm.ops.selective_scan_interface.selective_scan_fn (CUDA)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="mamba_ssm.selective_state_update",
        family=Family.SELECTIVE_SCAN,
        load=_load_selective_state_update,
        capabilities=Capabilities(
            dtypes=("float32", "float16", "bfloat16"),
            devices=("cpu", "cuda"),
            autograd=False,
            matmuls=False,
            unsupported=_triton_unsupported(
                {"float64": "the kernel computes each step in float32 (x, dt, A, B, C, D, z loaded .to(tl.float32))"}),
            slow=triton_interpreter.runs_interpreted(),
            notes="the Triton single-step kernel called once per step on a zero state in the input dtype; "
                  "grouped B/C through the multi-head form (mamba-ssm >= 2); interpreted on a machine without CUDA",
        ),
        description="mamba_ssm selective_state_update (Triton), stepped over the sequence",
        source=PACKAGE,
    ),
    _chunk_scan_spec(None),
    _chunk_scan_spec("ieee"),
    KernelSpec(
        name="mamba_ssm.ssd_chunk_scan_combined_ref",
        family=Family.SSD,
        load=_load_chunk_scan_combined_ref,
        capabilities=Capabilities(
            dtypes=("float32", "float16", "bfloat16"),
            devices=("cpu", "cuda"),
            chunk_sizes=(),
            lengths=Lengths.CHUNK_MULTIPLE,
            autograd=True,
            unsupported={"float64": "the reference casts dt to float32 (dt.float()) before its cumulative sums"},
            matmuls=True,
            square_scores=True,  # chunk_scan_ref: (chunk x chunk) scores per head, every chunk's at once
            square_matrices=3, chunks_at_once=True,  # measured 2.6 per chunk (tests/test_square_scores.py)
            decays_across_chunks=True,  # state_passing_ref: exp of differences of cumsums over every chunk
            skip_regimes=_TAKES_NEGATIVE_STEPS,  # dt.float() + bias, softplus when asked, and no clamp
            # dt.float() "before cumsum": its cumulative log-decays and their exps are float32 for half inputs
            chunk_computes_in={"float16": "float32", "bfloat16": "float32"},
            notes="mamba-ssm's pure-PyTorch SSD reference (chunk_state_ref, state_passing_ref, chunk_scan_ref); "
                  "takes no initial states, seq_idx or final states; lengths a multiple of the chunk (chunk_scan_ref "
                  "asserts it)",
            initial_state=False, final_state=False, varlen=False,
        ),
        description="mamba_ssm.ops.triton.ssd_combined.ssd_chunk_scan_combined_ref (PyTorch)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="mamba_ssm.ssd_minimal_discrete",
        family=Family.SSD,
        load=_load_ssd_minimal,
        capabilities=Capabilities(
            dtypes=ALL_DTYPES,
            devices=("cpu", "cuda"),
            chunk_sizes=(),
            lengths=Lengths.CHUNK_MULTIPLE,
            autograd=True,
            selective_options=False,
            skip_regimes=_TAKES_NEGATIVE_STEPS,
            matmuls=True,
            square_scores=True,  # (chunk x chunk) decays per head within chunks, every chunk's at once
            square_matrices=4, chunks_at_once=True,  # measured 3.1 per chunk in float64 (tests/test_square_scores.py)
            max_length=4096,  # and (chunks x chunks) between them: chunk 1 at L = 32,768 is 32k x 32k
            notes="Listing 1 of the Mamba-2 paper (mamba_ssm.modules.ssd_minimal), pure PyTorch in the input dtype; "
                  "takes the discretized X = x dt and A dt (formed by the adapter in the input dtype), B and C per "
                  "head (groups repeated), lengths a multiple of the chunk; no D, z, dt_bias, softplus or seq_idx; "
                  "and no dt_limit: a negative dt is used as given, where mamba_chunk_scan_combined clamps it to 0",
            initial_state=True, final_state=True, varlen=False,
        ),
        description="mamba_ssm.modules.ssd_minimal.ssd_minimal_discrete (PyTorch)",
        source=PACKAGE,
    ),
]
