"""What a plain user kernel supports, read from its Python signature.

A kernel named on the command line as ``file.py:fn`` or ``module:fn`` declares nothing; a `KernelSpec`
declares its `Capabilities`. Without a declaration the harness used the defaults, which hand a selective
scan D, z, a bias and the softplus flag and hand an SSD kernel no chunk size: a correct selective scan
without those options, or an SSD kernel written to the family's own signature (``chunk_size`` its sixth,
required argument), then failed every case with ``TypeError`` and was reported as a ``kernel_error``.
The signature says what the kernel takes, so it is read (`capabilities_from_signature`):

- a family's optional keywords (`FamilyDef.option_keywords`): all of them drawn only where the signature
  names every one (or takes ``**kwargs``); a kernel that names only some of them gets none;
- the gated families' initial state and final-state flag (`FamilyDef.state_keywords`): a kernel whose
  signature names them is handed initial states and has its final state measured, as the family's
  signature documents them;
- packed sequences (`FamilyDef.packed_keyword`, ``cu_seqlens`` / SSD's ``seq_idx``): a kernel whose signature
  names the keyword is handed packed rows now and then (a blind hunt's plain function took ``cu_seqlens`` and
  none of its 534 cases was packed, session 21);
- ``chunk_size``: a required one is handed the chunk sizes every chunked kernel supports (powers of two
  from 16, what Triton's ``tl.dot`` blocks allow), a default one that default only (the kernel's own
  choice, now known to the harness: its bound then carries the chunk-form term of the gated families
  and the selective scan); an SSD kernel whose signature cannot be read (``*args``) is handed one, as the
  family's signature says. A kernel that does not chunk defaults it to None: it is handed none, and its bound
  carries no chunk term (a step loop that took the required one and ignored it was charged a term it does not
  incur, and most of its bfloat16 cases were out of domain).

An ``nn.Module`` is read through its ``forward``: the module's ``__call__`` reads ``(*args, **kwargs)`` and hands
``forward`` what it is given, so its options are passed as a function's are. A signature that hides what it takes
(``*args`` / ``**kwargs`` in place of the family's keywords, or none that can be read) is handed none of them; the
capabilities name them (`Capabilities.untested_options`), and `harness check` says which went untested.

Nothing else is inferred: a kernel that takes more (other chunk sizes, grouped B and C left out) says so in a
`KernelSpec` (``harness check --kernel file.py:SPEC``).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Callable, Iterable

from harness.kernels.contract import Capabilities, Family

#: What a kernel that takes the family's chunk size and does not chunk is told: its bound carries a chunk term it
#: does not incur, which in bfloat16 left 19 of 25 cases of a blind hunt's SSD step loop unjudged (session 25).
_NO_CHUNK = ("; a kernel that does not chunk (a step loop) defaults chunk_size to None and is judged without that "
             "term, which leaves fewer half-precision cases out of domain")

#: Chunk sizes handed to a kernel whose signature requires ``chunk_size`` and declares no others.
REQUIRED_CHUNK_SIZES = (16, 32, 64)


def called_signature(fn: Callable) -> inspect.Signature | None:
    """The signature of what calling ``fn`` runs: an ``nn.Module``'s ``forward`` (its ``__call__`` reads ``(*args,
    **kwargs)``), else ``fn``'s own; None where it cannot be read (a builtin, an extension type)."""
    import torch

    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def hidden_options(family: Family | str, caps: Capabilities, named: "Iterable[str]" = ()) -> tuple[str, ...]:
    """The options of ``family``'s signature that ``caps`` passes to no case and that are not in ``named`` (the
    kernel's signature's parameters): for a signature that hides what it takes, the options left untested."""
    from harness import families

    fam = families.get(Family.parse(family))
    named = set(named)
    options: list[str] = [] if caps.selective_options else list(fam.option_keywords)
    if fam.state_keywords is not None:
        options += [keyword for keyword, taken in zip(fam.state_keywords, (caps.initial_state, caps.final_state))
                    if not taken]
    if fam.scale_keyword is not None and not caps.scale:
        options.append(fam.scale_keyword)
    if fam.packed_keyword is not None and not caps.varlen:
        options.append(fam.packed_keyword)
    if fam.chunk_term and not caps.takes_chunk:
        options.append("chunk_size")
    return tuple(option for option in options if option not in named)


def capabilities_from_signature(fn: Callable, family: Family | str,
                                base: Capabilities | None = None) -> tuple[Capabilities, list[str]]:
    """``base`` (the defaults for a user kernel) as far as ``fn``'s signature allows (an ``nn.Module``'s
    ``forward``'s, `called_signature`), and one line per inference that changed it (for the user: what is not
    drawn, and why). Where the signature hides what it takes, the options so left out are the capabilities'
    ``untested_options``."""
    from harness import families

    fam = families.get(Family.parse(family))
    caps = base or Capabilities(devices=("cpu", "cuda"))
    signature = called_signature(fn)
    if signature is None:  # nothing to read: every option it may take is left untested
        return replace(caps, untested_options=hidden_options(family, caps)), []
    params = signature.parameters
    kinds = {p.kind for p in params.values()}
    open_keywords = inspect.Parameter.VAR_KEYWORD in kinds
    open_positional = inspect.Parameter.VAR_POSITIONAL in kinds
    notes = []
    missing = [n for n in fam.option_keywords if n not in params]
    if missing and not open_keywords and caps.selective_options:
        caps = replace(caps, selective_options=False)
        notes.append(f"its signature takes no {', '.join(missing)}: cases without "
                     f"{', '.join(fam.option_keywords)} only")
    if fam.state_keywords is not None:
        # (keyword, capability, what the cases then have) for each state keyword the signature names
        found = [(keyword, field, what) for keyword, field, what in
                 zip(fam.state_keywords, ("initial_state", "final_state"), ("an initial state", "the final state checked"))
                 if keyword in params and not getattr(caps, field)]
        if found:
            caps = replace(caps, **{field: True for _, field, _ in found})
            notes.append(f"its signature takes {' and '.join(k for k, _, _ in found)}: cases with "
                         f"{' and '.join(w for _, _, w in found)}")
    if fam.scale_keyword is not None and fam.scale_keyword in params and not caps.scale:
        caps = replace(caps, scale=True)
        from harness.families.simple_gla import SCALES

        passed = ", ".join(f"{s:g}" for s in SCALES if s is not None)
        notes.append(f"its signature takes {fam.scale_keyword}: cases pass one now and then ({passed})")
    if fam.packed_keyword is not None and fam.packed_keyword in params and not caps.varlen:
        caps = replace(caps, varlen=True)
        notes.append(f"its signature takes {fam.packed_keyword}: cases pack several sequences in a row now and then")
    chunk = params.get("chunk_size")
    sizes = None
    if chunk is not None and chunk.default is inspect.Parameter.empty:
        sizes = REQUIRED_CHUNK_SIZES
        notes.append(f"its signature requires chunk_size: chunk sizes {', '.join(map(str, sizes))} are drawn, and "
                     f"the bound carries the chunk form's term for them{_NO_CHUNK}")
    elif chunk is not None and type(chunk.default) is int and chunk.default >= 1:
        sizes = (chunk.default,)
        notes.append(f"its signature defaults chunk_size to {chunk.default}: that chunk size is passed, and the "
                     "bound carries the chunk form's term for it")
    elif chunk is None and fam.chunk_positional and open_positional:
        sizes = REQUIRED_CHUNK_SIZES
        notes.append(f"its signature cannot be read (*args) and the family's takes chunk_size: chunk sizes "
                     f"{', '.join(map(str, sizes))} are drawn, and the bound carries the chunk form's term for them"
                     f"{_NO_CHUNK}")
    if sizes is not None and caps.chunk_sizes is None:
        caps = replace(caps, chunk_sizes=sizes)
    if open_keywords or open_positional:  # it may take more than it names: what it is not handed goes untested
        caps = replace(caps, untested_options=hidden_options(family, caps, params))
    return caps, notes
