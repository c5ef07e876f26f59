"""Planted bugs of tiled kernels: a dimension processed in tiles, the last partial tile lost, and heads
mapped to their B/C group the wrong way. Each is the in-tree stable chunk form (`harness.kernels.gated_forms`)
with the one mistake; only a head dim or state size just past a tile (`harness.settings.Limits.tile_edges`)
or an ssd case with two groups of two heads or more shows it, which the ci draws used not to make
(found by a kernel author's view: Triton kernels tile K, V and the state in blocks of 16 to 64).
"""

from __future__ import annotations

import torch

from harness.kernels import gated_forms as gf
from harness.kernels.contract import Family
from harness.problems import Problem
from tests.planted.bugs import PlantedBug
from tests.planted.gated import GATED_CAPS

TILE = 16


def _full_tiles(n: int) -> int:
    """How many of ``n`` entries a kernel that drops the last partial tile of `TILE` keeps."""
    return n if n <= TILE else TILE * (n // TILE)


def simple_gla_drops_last_key_tile(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None, chunk_size=gf.DEFAULT_CHUNK):
    """Simple GLA whose q k^T runs over K in tiles of 16 and loses the last partial tile (K > 16, K % 16 != 0):
    the scores miss those key dims. ``scale`` stays K's."""
    keep = _full_tiles(q.shape[-1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = q.clone(), k.clone()
    q[..., keep:] = 0
    k[..., keep:] = 0
    return gf.simple_gla_chunk(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size)


def ssd_groups_by_modulo(x, dt, A, B, C, chunk_size=gf.DEFAULT_CHUNK, D=None, z=None, dt_bias=None,
                         dt_softplus=False, initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2 SSD where head h reads B/C group ``h % G`` instead of ``h // (H / G)``: right for one group
    and for one head per group."""
    index = torch.arange(x.shape[2], device=B.device) % B.shape[2]
    return gf.ssd_chunk(x, dt, A, B[:, :, index], C[:, :, index], chunk_size, D, z, dt_bias, dt_softplus,
                        initial_states, seq_idx, return_final_states)


def ssd_drops_last_state_tile(x, dt, A, B, C, chunk_size=gf.DEFAULT_CHUNK, D=None, z=None, dt_bias=None,
                              dt_softplus=False, initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2 SSD whose state runs in tiles of 16 and loses the last partial tile (N > 16, N % 16 != 0)."""
    keep = _full_tiles(B.shape[-1])
    B, C = B.clone(), C.clone()
    B[..., keep:] = 0
    C[..., keep:] = 0
    return gf.ssd_chunk(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx,
                        return_final_states)


for _fn in (simple_gla_drops_last_key_tile, ssd_groups_by_modulo, ssd_drops_last_state_tile):
    _fn.__qualname__ = _fn.__name__  # picklable by name

_past_tile = dict(length=9, dtype="float64", batch=1, chunk_size=4, seed=1)

TILING_PLANTED: list[PlantedBug] = [
    PlantedBug("simple_gla_drops_last_key_tile", Family.SIMPLE_GLA, simple_gla_drops_last_key_tile,
               "q k^T over K in tiles of 16, the last partial tile lost", exposed_by="dk > 16, dk not a multiple of 16",
               capabilities=GATED_CAPS, exposes=lambda p: p.dk > TILE and p.dk % TILE != 0,
               witness=Problem(family="simple_gla", heads=1, dk=17, dv=2, **_past_tile)),
    PlantedBug("ssd_groups_by_modulo", Family.SSD, ssd_groups_by_modulo,
               "head h reads B/C group h % G instead of h // (H / G)",
               exposed_by="2 or more groups of 2 or more heads", capabilities=gf.CHUNK_CAPS,
               exposes=lambda p: p.groups >= 2 and p.heads // p.groups >= 2,
               witness=Problem(family="ssd", heads=4, groups=2, dv=2, state=3, **_past_tile)),
    PlantedBug("ssd_drops_last_state_tile", Family.SSD, ssd_drops_last_state_tile,
               "the state N in tiles of 16, the last partial tile lost",
               exposed_by="state > 16, not a multiple of 16", capabilities=gf.CHUNK_CAPS,
               exposes=lambda p: p.state > TILE and p.state % TILE != 0,
               witness=Problem(family="ssd", heads=1, groups=1, dv=2, state=17, **_past_tile)),
]
