"""``selective_scan``: mamba-ssm's ``selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None,
delta_softplus=False) -> y``; u, delta (batch, dim, L); A (dim, N); B, C (batch, N, L) or grouped
(batch, G, N, L); D (dim,); z (batch, dim, L); delta_bias (dim,)."""

from __future__ import annotations

import torch

from harness.families.base import FamilyDef, option_slips, randn, softplus_overflow, uniform
from harness.families.ssd import SOFTPLUS_CONVENTIONS_AGREE, SOFTPLUS_SHIFT
from harness.kernels.contract import Family

_OPTIONAL = ("D", "z", "delta_bias")


class SelectiveScan(FamilyDef):
    family = Family.SELECTIVE_SCAN
    arg_order = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    linear_input = "u"
    option_keywords = (*_OPTIONAL, "delta_softplus")
    chunk_term = True
    regimes = ("trained", "long_memory", "fast_decay", "large", "tiny", "unstable", "large_dt")
    grad_inputs = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    length_axis = -1
    per_step_inputs = ("u", "delta", "B", "C", "z")

    def input_axes(self, p, name):
        if name in ("B", "C"):
            return ("batch", "group", "state", "t") if p.groups else ("batch", "state", "t")
        return {"A": ("channel", "state"), "D": ("channel",), "delta_bias": ("channel",)}.get(name)

    def shapes(self, p):
        b, d, n, L = p.batch, p.dim, p.state, p.length
        bc = (b, p.groups, n, L) if p.groups else (b, n, L)
        shapes = {"u": (b, d, L), "delta": (b, d, L), "A": (d, n), "B": bc, "C": bc}
        if p.has_D:
            shapes["D"] = (d,)
        if p.has_z:
            shapes["z"] = (b, d, L)
        if p.has_delta_bias:
            shapes["delta_bias"] = (d,)
        return shapes

    def output_shape(self, p):
        return (p.batch, p.dim, p.length)

    def generate(self, p, shapes, gen):
        b, d, n, L = p.batch, p.dim, p.state, p.length
        s = self.data_scale(p.regime, p.scale_dtype)
        if p.regime == "unstable":
            delta = randn((b, d, L), gen)
            A = randn((d, n), gen)
        else:
            if p.regime == "long_memory":
                dt = 10.0 ** uniform((d, 1), gen, -4.0, -3.0)
                A = -uniform((d, n), gen, 0.01, 1.0)
            elif p.regime == "fast_decay":
                dt = uniform((d, 1), gen, 0.5, 1.0)
                A = -uniform((d, n), gen, 2.0, 10.0)
            elif p.regime == "large_dt":
                dt = uniform((d, 1), gen, 20.0, 60.0)
                A = -uniform((d, n), gen, 0.05, 0.5)
            else:
                dt = 10.0 ** uniform((d, 1), gen, -3.0, -1.0)
                A = -torch.exp(torch.log(torch.arange(1, n + 1, dtype=torch.float64)) + 0.1 * randn((d, n), gen))
            if p.delta_softplus:
                # raw pre-activation whose softplus is about dt (dt itself where softplus is linear, above 20):
                # the kernel applies the softplus
                raw = torch.where(dt > 20.0, dt, torch.log(torch.expm1(dt)))
                delta = raw + 0.5 * randn((b, d, L), gen)
                if p.dtype == "float64":  # out of the band where the two softplus conventions differ (ssd's)
                    delta = torch.where((delta > 20.0) & (delta < SOFTPLUS_CONVENTIONS_AGREE), delta + SOFTPLUS_SHIFT,
                                        delta)
            else:
                delta = dt * torch.exp(0.5 * randn((b, d, L), gen))
        out = {"u": randn((b, d, L), gen) * s, "delta": delta, "A": A,
               "B": randn(shapes["B"], gen) * s, "C": randn(shapes["C"], gen) * s}
        if p.has_D:  # D u is an output term like C h (~ s**3): D ~ s**2 keeps both paths visible
            out["D"] = randn((d,), gen) * s * s
        if p.has_z:
            out["z"] = randn((b, d, L), gen)
        if p.has_delta_bias:
            bias = 0.1 * randn((d,), gen)
            if p.regime != "unstable" and not p.delta_softplus:
                # The decays see delta + bias: keep that sum the regime's positive draw, so every decay
                # factor stays below 1 whatever the bias (a bias of 0.1 against a step of 1e-4 made
                # long_memory's decays reach 1.1 and its state grow: that is the unstable regime). The bias
                # is scaled to the channel's step and taken out of delta (which may then be negative).
                bias = bias * dt[:, 0]
                out["delta"] = delta - bias[None, :, None]
            out["delta_bias"] = bias
        return out

    def function_room(self, p):
        """exp(delta A) 1, the bias add 1, softplus (log1p of exp) 2, silu (exp, add, divide, multiply) 2."""
        return 1.0 + p.has_delta_bias + 2.0 * p.delta_softplus + 2.0 * p.has_z

    def contract_hint(self, p):
        if not p.groups:
            return None
        return (f"this case hands B and C grouped, (batch, G={p.groups}, N, L), as the family's signature allows "
                "(mamba-ssm's selective_scan_fn takes both); a kernel that takes only (batch, N, L) declares "
                "Capabilities(grouped_bc=False) in a KernelSpec (harness check --kernel file.py:SPEC)")

    def call_kwargs(self, p):
        kw = {"delta_softplus": True} if p.delta_softplus else {}
        kw.update(super().call_kwargs(p))
        return kw

    def call_args(self, p, inputs, kwargs):
        args = tuple(inputs[n] for n in ("u", "delta", "A", "B", "C"))
        for name in _OPTIONAL:
            if name in inputs:
                kwargs[name] = inputs[name]
        return args, kwargs

    def trace(self, p, x, convention):
        """The oracle's trace; for a kernel that takes a chunk size, with the chunk term in its growth
        (`reference_impls.selective_scan.selective_scan_chunk_growth`: decays formed as exp of cumulative
        sums within each chunk, the gated families' chunk-form rounding)."""
        from dataclasses import replace

        from reference_impls.selective_scan import selective_scan_chunk_growth, selective_scan_trace

        args = (x["u"], x["delta"], x["A"], x["B"], x["C"])
        kw = dict(D=x.get("D"), z=x.get("z"), delta_bias=x.get("delta_bias"), delta_softplus=p.delta_softplus)
        trace = selective_scan_trace(*args, **kw)
        if p.chunk_size is None:
            return trace
        chunk = selective_scan_chunk_growth(*args, **kw, chunk_size=p.chunk_size)
        return replace(trace, growth=trace.growth + chunk, chunk_growth=chunk)

    def nonfinite_hint(self, p, x, precision):
        bias = x.get("delta_bias")
        step = x["delta"].to(torch.float64)
        return softplus_overflow(p, step if bias is None else step + bias.to(torch.float64)[:, None], precision)

    def slips(self, p, x):
        return option_slips(p, x, terms=(("D", "the skip term D * u"), ("z", "the output gate silu(z)"),
                                         ("delta_bias", "delta_bias (delta used without it)")),
                            step="delta", bias="delta_bias", softplus="delta_softplus",
                            biased=lambda step, bias: step + bias[:, None])

    def differentiable(self, p, x, convention):
        from reference_impls import autograd as ad

        return ad.selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], D=x.get("D"), z=x.get("z"),
                                 delta_bias=x.get("delta_bias"), delta_softplus=p.delta_softplus)

    def gradient_traces(self, p, x, cot, names, convention):
        """The selective scan is GLA with one head per channel d: ``q = C`` and ``k = B`` (each channel reading its
        group's), ``v = d' u`` (one value), the log-decay ``g = d' A`` per state entry n (the key channel) and scale
        1, plus ``D u``. So du, dB and dC are GLA's dv, dk and dq (`harness.families.simple_gla.gated_adjoints`: dv
        one GLA backwards, dq and dk one simple GLA per state entry) with ``du = d' dv + D cot``
        (`harness.families.ssd.stepped_input_trace`), dB and dC summed over each group's channels (over every
        channel when B and C are ungrouped). delta's, delta_bias's and A's follow from GLA's dg
        (`simple_gla.gate_adjoint`, the reversed sums of q dq - k dk per state entry) and dv
        (`harness.families.ssd.step_adjoints`); dD is the sum over the batch and steps of u cot. An output gated by
        silu(z) passes its cotangent through the gate first (`harness.families.ssd.gate_pullback`, which gives dz)."""
        from harness.families.simple_gla import gate_adjoint, gated_adjoints
        from harness.families.ssd import SSD_ADJOINTS, gate_pullback, step_adjoints, stepped_input_trace
        from reference_impls.selective_scan import delta_prime
        from reference_impls.trace import Trace

        ours = {"u": "x", "B": "B", "C": "C"}  # the selective scan's names for SSD's inputs
        steps_wanted = bool({"delta", "A", "delta_bias"} & set(names))
        step = delta_prime(x["delta"], x.get("delta_bias"), p.delta_softplus).transpose(1, 2)[..., None]
        per = p.dim // (p.groups or 1)  # channels per group

        def channels(m):  # (batch, [G,] N, L) -> (batch, L, dim, N), each channel its group's
            m = m if m.dim() == 4 else m[:, None]
            return m.permute(0, 3, 1, 2).repeat_interleave(per, dim=2)

        traces = {}
        if p.has_z:
            cot, traces["z"] = gate_pullback(self, p, x, cot, convention, "z" in names)
        u_ = x["u"].transpose(1, 2)[..., None]  # (batch, L, dim, 1), as cot_
        gated = {"q": channels(x["C"]), "k": channels(x["B"]), "v": step * u_, "g": step * x["A"]}
        cot_ = cot.transpose(1, 2)[..., None]
        wanted = {SSD_ADJOINTS[ours[n]] for n in names if n in ours} | ({"q", "k", "v"} if steps_wanted else set())
        adjoints = gated_adjoints(gated, cot_, tuple(sorted(wanted)), scale=1.0, chunk_size=p.chunk_size,
                                  cu_seqlens=None, per_key=True)
        for name in ("B", "C"):
            if name in names:
                t = adjoints[SSD_ADJOINTS[name]].mapped(lambda f: f.reshape(*f.shape[:2], -1, per, f.shape[-1]))
                t = t.summed(3).mapped(lambda f: f.permute(0, 2, 3, 1))  # (batch, G, N, L)
                traces[name] = t if p.groups else t.mapped(lambda f: f[:, 0])
        if "u" in names:
            direct = x["D"].view(1, 1, -1, 1) * cot_ if "D" in x else torch.zeros_like(cot_)
            traces["u"] = stepped_input_trace(adjoints["v"], step, direct).mapped(lambda f: f[..., 0].transpose(1, 2))
        if "D" in names:
            traces["D"] = Trace.of_product(u_[..., 0], cot_[..., 0]).summed(1).summed(0)
        if steps_wanted:
            dg = gate_adjoint(gated["q"], gated["k"], adjoints["q"], adjoints["k"], bounds=[0, p.length],
                              keys=p.state, per_key=True)  # (batch, L, dim, N)
            pre = (x["delta"] if "delta_bias" not in x else x["delta"] + x["delta_bias"][:, None]).transpose(1, 2)
            d_pre, d_a = step_adjoints(dg, x["A"], adjoints["v"], u_, step, pre, softplus=p.delta_softplus,
                                       clamped=False)
            traces.update({"A": d_a, "delta": d_pre.mapped(lambda f: f.transpose(1, 2)),
                           "delta_bias": d_pre.summed(1).summed(0)})
        return {name: t for name, t in traces.items() if name in names}

    def element_bounds(self, p, name):
        unstable, softplus = p.regime == "unstable", p.delta_softplus
        if name == "delta":
            if p.regime == "large_dt":
                return (SOFTPLUS_CONVENTIONS_AGREE if p.dtype == "float64" else 20.0, 60.0)
            return (-2.0, 2.0) if unstable or softplus else (0.0, 1.0)
        if name == "A":
            return (-2.0, 2.0) if unstable else (-4.0, 0.0)
        if name == "D":
            s = self.data_scale(p.regime, p.scale_dtype)
            return (-2.0 * s * s, 2.0 * s * s)
        if name == "delta_bias" and not unstable and not softplus:
            return (0.0, 1.0)  # delta + bias >= 0: every decay at or below 1 (`harness.problems`)
        if name in ("z", "delta_bias"):
            return (-2.0, 2.0)
        return super().element_bounds(p, name)

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        fields = {}
        if caps.grouped_bc and draw(st.booleans()):
            # dim = G * (channels per group): every G with 2 or more channels per group tells the right
            # channel-to-group map (d // (dim/G)) from a wrong one (d % G); both factors shrink to 1
            fields["groups"] = draw(st.integers(1, max(1, lim.max_dim // 2)))
            fields["dim"] = fields["groups"] * draw(st.integers(1, max(1, lim.max_dim // fields["groups"])))
        else:
            fields["dim"] = draw(st.integers(1, lim.max_dim))
        max_n = min(lim.max_state, caps.max_state or lim.max_state)
        # no tile edges here: the selective-scan kernels loop over N rather than tile it, and at N = 33 the
        # in-tree Blelloch scan's float32 gradient overflows in `large` where the loop's does not (a range
        # loss of autograd through the tree, which the gradient check names a bug: left for later)
        fields["state"] = draw(st.integers(1, max_n))
        if caps.selective_options:
            for flag in ("has_D", "has_z", "has_delta_bias", "delta_softplus"):
                fields[flag] = draw(st.booleans())
            if regime == "unstable":  # the seed's form: raw delta, no softplus
                fields["delta_softplus"] = False
            if regime == "large_dt":  # pre-activations where a softplus written as log1p(exp(x)) overflows
                fields["delta_softplus"] = True
        return fields


FAMILY = SelectiveScan()
