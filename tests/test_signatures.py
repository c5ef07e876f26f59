"""A plain user kernel is driven as its signature allows (`harness.signatures`).

Without the inference, the two correct kernels below failed every case with ``TypeError`` and were
reported as ``kernel_error``: an SSD kernel written to the family's own signature (``chunk_size`` required)
and a selective scan that takes no D, z, bias or softplus flag.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import check
from harness.api import user_kernel_spec
from harness.families.simple_gla import SCALES
from harness.kernels import registry
from harness.kernels.contract import Capabilities
from harness.signatures import REQUIRED_CHUNK_SIZES, capabilities_from_signature, hidden_options

ROOT = Path(__file__).resolve().parents[1]
_SSD = registry.get("intree.ssd_chunk").callable()
_SELECTIVE = registry.get("intree.sequential_selective_scan").callable()


def ssd_as_documented(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False):
    """The README's SSD signature, chunk_size required and positional."""
    assert chunk_size in REQUIRED_CHUNK_SIZES, chunk_size
    return _SSD(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)


def selective_without_options(u, delta, A, B, C):
    return _SELECTIVE(u, delta, A, B, C)


def chunked_with_default(q, k, v, g, chunk_size=32):
    return registry.get("intree.simple_gla_chunk").callable()(q, k, v, g, chunk_size=chunk_size)


def takes_anything(*args, **kwargs):
    return _SSD(*args, **kwargs)


def test_a_required_chunk_size_is_handed_the_chunk_sizes_every_chunked_kernel_supports():
    caps, notes = capabilities_from_signature(ssd_as_documented, "ssd")
    assert caps.chunk_sizes == REQUIRED_CHUNK_SIZES and caps.selective_options
    note, = notes
    assert "requires chunk_size" in note and "bound" in note, note
    # the chunk sizes drawn are named, each once, and no other number; a step loop is told to default to None
    assert [int(n) for n in re.findall(r"\d+", note)] == list(REQUIRED_CHUNK_SIZES), note
    assert "defaults chunk_size to None" in note, note


def test_an_ssd_kernel_written_to_the_family_signature_passes_check():
    result = check(ssd_as_documented, family="ssd", profile="dev", dtypes=("float64",), max_examples=8,
                   max_length=96, grad=False, save_counterexample=False)
    assert result.passed, result.message
    assert {r["chunk_size"] for r in result.records} <= set(REQUIRED_CHUNK_SIZES)
    assert len(result.records) >= 4


def test_missing_option_keywords_mean_cases_without_them():
    caps, notes = capabilities_from_signature(selective_without_options, "selective_scan")
    assert caps.selective_options is False and caps.chunk_sizes is None
    assert "takes no D, z, delta_bias, delta_softplus" in notes[0]
    result = check(selective_without_options, family="selective_scan", profile="dev", dtypes=("float64",),
                   max_examples=8, max_length=64, grad=False, save_counterexample=False)
    assert result.passed, result.message


def test_a_default_chunk_size_is_passed_so_the_bound_knows_it():
    caps, notes = capabilities_from_signature(chunked_with_default, "simple_gla")
    assert caps.chunk_sizes == (32,) and "defaults chunk_size to 32" in notes[0]


@pytest.mark.parametrize("family", ["ssd", "selective_scan"])
def test_an_unreadable_or_open_signature_keeps_the_defaults_except_ssd_s_chunk(family):
    caps, notes = capabilities_from_signature(takes_anything, family)
    assert caps.selective_options  # **kwargs: it may take every option
    assert caps.chunk_sizes == (REQUIRED_CHUNK_SIZES if family == "ssd" else None)
    unread, notes = capabilities_from_signature(torch.add, family)  # no signature: the defaults, every option untested
    assert notes == [] and dataclasses.replace(unread, untested_options=()) == Capabilities(devices=("cpu", "cuda"))
    assert unread.untested_options == hidden_options(family, Capabilities()) != ()


def test_an_open_signature_names_the_options_it_leaves_untested():
    """``(*args, **kwargs)`` hides which of the family's options the kernel takes: none of them is passed, and the
    capabilities name them (`Capabilities.untested_options`); a signature that names its options, or one without
    ``*args`` / ``**kwargs``, leaves none untested."""
    caps, _ = capabilities_from_signature(takes_anything, "simple_gla")
    assert set(caps.untested_options) == {"initial_state", "output_final_state", "scale", "cu_seqlens", "chunk_size"}
    assert not (caps.initial_state or caps.final_state or caps.scale or caps.varlen or caps.takes_chunk)
    ssd, _ = capabilities_from_signature(takes_anything, "ssd")  # its chunk size is handed (positional); D, z... too
    assert set(ssd.untested_options) == {"initial_states", "return_final_states", "seq_idx"}

    def named_and_open(q, k, v, g, scale=None, initial_state=None, output_final_state=False, **kwargs):
        return _GLA(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)

    partly, _ = capabilities_from_signature(named_and_open, "gla")
    assert set(partly.untested_options) == {"cu_seqlens", "chunk_size"}
    assert capabilities_from_signature(gla_as_documented, "gla")[0].untested_options == ()  # it takes what it names


class GlaModule(torch.nn.Module):
    """fla's signature in a module's ``forward``; ``ignore_state`` plants a slip: the initial state is dropped."""

    def __init__(self, ignore_state: bool = False):
        super().__init__()
        self.ignore_state = ignore_state

    def forward(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False):
        return _GLA(q, k, v, g, scale=scale, initial_state=None if self.ignore_state else initial_state,
                    output_final_state=output_final_state)


class OpenModule(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return _GLA(*args, **kwargs)


def test_a_module_is_read_through_its_forward():
    """A module's ``__call__`` reads ``(*args, **kwargs)``: read there, it was handed no initial state, final-state
    flag or scale, and nothing said so. Its ``forward`` is what it takes."""
    caps, notes = capabilities_from_signature(GlaModule(), "gla")
    assert caps.initial_state and caps.final_state and caps.scale and caps.untested_options == ()
    assert capabilities_from_signature(GlaModule(), "gla") == capabilities_from_signature(gla_as_documented, "gla")

    class Chunked(torch.nn.Module):
        def forward(self, q, k, v, g, chunk_size=32):
            return chunked_with_default(q, k, v, g, chunk_size=chunk_size)

    assert capabilities_from_signature(Chunked(), "simple_gla")[0].chunk_sizes == (32,)
    hidden, _ = capabilities_from_signature(OpenModule(), "gla")
    assert "initial_state" in hidden.untested_options and not hidden.initial_state


def test_a_module_s_forward_options_are_passed():
    """Its cases hand it initial states and check its final state, so a module that drops its initial state is found."""
    passing = check(GlaModule(), family="gla", profile="dev", dtypes=("float64",), max_examples=10, max_length=48,
                    grad=False, save_counterexample=False, isolation="in-process")
    assert passing.passed, passing.message
    assert any(r.get("has_initial_state") for r in passing.records)
    assert any(r.get("final_state") for r in passing.records)
    assert {r.get("scale") for r in passing.records} - {None}
    result = check(GlaModule(ignore_state=True), family="gla", profile="dev", dtypes=("float64",), max_examples=20,
                   max_length=48, grad=False, save_counterexample=False, isolation="in-process")
    assert not result.passed and result.failure["cause"] == "kernel_bug" and result.failure["has_initial_state"]


@pytest.mark.e2e
def test_check_names_the_options_a_hidden_signature_left_untested(tmp_path):
    """One line under `harness check`'s searches names them (`CheckResult.untested_options`); none for a module whose
    forward names them."""
    kernel = tmp_path / "mine.py"
    kernel.write_text("from tests.test_signatures import GlaModule, OpenModule\nopen_module = OpenModule()\n"
                      "full_module = GlaModule()\n")
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "--family", "gla", "--kernel",
                           f"{kernel}:open_module", "--kernel", f"{kernel}:full_module", "--profile", "dev",
                           "--dtypes", "float64", "--max-examples", "3", "--max-length", "16", "--no-grad",
                           "--in-process", "--report-dir", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    searches = proc.stdout[proc.stdout.index("\nsearches:"):]
    untested = [line for line in searches.splitlines() if "options not tested" in line]
    assert len(untested) == 1 and untested[0].strip().startswith("mine.py:open_module: "), searches
    assert all(option in untested[0] for option in ("initial_state", "output_final_state", "scale", "cu_seqlens"))


def test_a_full_signature_and_a_declaration_are_left_as_they_are():
    assert capabilities_from_signature(_SELECTIVE, "selective_scan") == (Capabilities(devices=("cpu", "cuda")), [])
    declared = Capabilities(dtypes=("float32",))
    spec = user_kernel_spec(selective_without_options, family="selective_scan", capabilities=declared)
    assert spec.capabilities is declared


@pytest.mark.e2e
def test_check_says_what_the_signature_left_out(tmp_path):
    kernel = tmp_path / "mine.py"
    kernel.write_text("from tests.test_signatures import selective_without_options as scan\n")
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "--family", "selective_scan", "--kernel",
                           f"{kernel}:scan", "--profile", "dev", "--dtypes", "float32", "--max-examples", "3",
                           "--max-length", "16", "--no-grad", "--in-process", "--report-dir", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # named from the project's root (here the working directory), however typed (`canonical_target`)
    assert "user.mine.py:scan: its signature takes no D, z, delta_bias, delta_softplus" in proc.stdout


_GLA = registry.get("intree.gla_recurrent").callable()


def gla_as_documented(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    return _GLA(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


def gla_ignoring_its_initial_state(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    return _GLA(q, k, v, g, scale=scale, output_final_state=output_final_state)


def test_a_gated_signature_with_the_state_keywords_gets_states():
    caps, notes = capabilities_from_signature(gla_as_documented, "gla")
    assert caps.initial_state and caps.final_state and not caps.varlen
    state_note, scale_note = notes
    assert "initial_state" in state_note and "output_final_state" in state_note, state_note
    assert "scale" in scale_note and "initial_state" not in scale_note, scale_note
    # the scales a case passes, as numbers: the family's (`SCALES`), None (the default) left out
    passed = re.search(r"\(([^()]*)\)$", scale_note)
    assert passed is not None, scale_note
    assert [float(x) for x in passed.group(1).split(",")] == [x for x in SCALES if x is not None], scale_note
    result = check(gla_as_documented, family="gla", profile="dev", dtypes=("float64",), max_examples=10,
                   max_length=48, grad=False, save_counterexample=False)
    assert result.passed, result.message
    assert any(r.get("has_initial_state") for r in result.records)
    assert any(r.get("final_state") for r in result.records)


def gla_ignoring_its_scale(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    return _GLA(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state)


def test_a_kernel_that_ignores_the_scale_it_takes_is_caught():
    """fla's signature has ``scale``; no case passed one, so a kernel that ignored it (or applied it to the
    within-chunk part only) passed every case (found by a kernel written elsewhere: 60 of 60 equivalent)."""
    passing = check(gla_as_documented, family="gla", profile="ci", dtypes=("float64",), max_examples=25,
                    max_length=48, grad=False, save_counterexample=False)
    assert passing.passed, passing.message
    assert {r.get("scale") for r in passing.records} >= {None, 1.0, 0.25}
    result = check(gla_ignoring_its_scale, family="gla", profile="ci", dtypes=("float64",), max_examples=25,
                   max_length=48, grad=False, save_counterexample=False)
    # named: the output is dk**-0.5 / scale times the oracle's (`runner._constant_factor`)
    assert not result.passed and result.failure["cause"] == "constant_factor", result.message
    assert result.failure["scale"] in (1.0, 0.25) and "scale=" in result.message, result.message
    assert "passed was ignored (dk**-0.5 used)" in result.message, result.message


def test_a_kernel_that_ignores_the_initial_state_it_takes_is_caught():
    result = check(gla_ignoring_its_initial_state, family="gla", profile="dev", dtypes=("float64",),
                   max_examples=20, max_length=48, grad=False, save_counterexample=False)
    assert not result.passed and result.failure["cause"] == "kernel_bug"
    assert result.failure["has_initial_state"]
    assert "Call: fn(q (" in result.message and "initial_state=(" in result.message, result.message


def no_groups(u, delta, A, B, C):
    if B.dim() != 3:
        raise ValueError(f"B must be (batch, N, L), got {tuple(B.shape)}")
    return _SELECTIVE(u, delta, A, B, C)


def test_a_kernel_without_grouped_b_and_c_is_told_how_to_say_so():
    result = check(no_groups, family="selective_scan", profile="dev", dtypes=("float64",), max_examples=20,
                   max_length=16, grad=False, save_counterexample=False)
    assert not result.passed and result.failure["outcome"] == "raised"
    assert "Hint: this case hands B and C grouped, (batch, G=" in result.message, result.message
    declared = Capabilities(devices=("cpu", "cuda"), selective_options=False, grouped_bc=False)
    result = check(user_kernel_spec(no_groups, family="selective_scan", capabilities=declared), dtypes=("float64",),
                   profile="dev", max_examples=20, max_length=16, grad=False, save_counterexample=False)
    assert result.passed, result.message


def gla_float32_states_only(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise AssertionError("initial_state must be in float32.")  # as fla's chunk_gla asserts
    return _GLA(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


def test_a_kernel_refusing_the_initial_state_s_dtype_is_told_what_it_was_handed():
    result = check(gla_float32_states_only, family="gla", profile="dev", dtypes=("float64",), max_examples=20,
                   max_length=16, grad=False, save_counterexample=False)
    assert not result.passed and result.failure["outcome"] == "raised"
    assert "Hint: this case hands an initial state (initial_state, in the case's dtype float64" in result.message


def test_the_call_line_gives_a_packed_batch_s_boundaries():
    """A varlen bug depends on where the sequences start: the `Call:` line said ``cu_seqlens=(3,) int64`` and
    the user opened the case file to learn them. ssd's ``seq_idx`` says which cu_seqlens it was made of."""
    from harness.problems import Problem

    gla = Problem(family="gla", length=5, dtype="float32", batch=1, heads=2, dk=4, dv=4, cu_seqlens=(0, 2, 5))
    assert gla.describe_call().endswith("cu_seqlens=(3,) int64 [0, 2, 5])"), gla.describe_call()
    ssd = Problem(family="ssd", length=5, dtype="float32", batch=1, heads=2, groups=1, dim=4, state=4,
                  cu_seqlens=(0, 2, 5), chunk_size=2)
    assert "seq_idx=(1, 5) int32 (cu_seqlens [0, 2, 5])" in ssd.describe_call(), ssd.describe_call()
    plain = Problem(family="gla", length=5, dtype="float32", batch=1, heads=2, dk=4, dv=4)
    assert "cu_seqlens" not in plain.describe_call()


def simple_gla_packed(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    from reference_impls.gated_decay import simple_gla

    return simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, compute_dtype=q.dtype)


def simple_gla_ignoring_its_packing(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                    cu_seqlens=None):
    return simple_gla_packed(q, k, v, g, scale, initial_state, output_final_state)


def test_a_signature_that_takes_cu_seqlens_gets_packed_rows():
    """A plain function naming ``cu_seqlens`` (SSD: ``seq_idx``) is handed packed rows: before, none of a blind
    hunt's 534 cases of such a kernel was packed (session 21). A kernel that takes it and ignores it is caught."""
    caps, notes = capabilities_from_signature(simple_gla_packed, "simple_gla")
    assert caps.varlen and any("cu_seqlens" in n for n in notes), notes
    assert capabilities_from_signature(lambda x, dt, A, B, C, chunk_size, seq_idx=None: x, "ssd")[0].varlen
    result = check(simple_gla_packed, family="simple_gla", profile="dev", dtypes=("float64",), max_examples=20,
                   max_length=48, grad=False, save_counterexample=False)
    assert result.passed, result.message
    assert any(r.get("cu_seqlens") for r in result.records)
    wrong = check(simple_gla_ignoring_its_packing, family="simple_gla", profile="dev", dtypes=("float64",),
                  max_examples=30, max_length=48, grad=False, save_counterexample=False)
    assert not wrong.passed


def test_a_step_loop_defaulting_chunk_size_to_none_is_judged_without_the_chunk_term():
    """A blind hunt's SSD step loop took the family's required chunk_size and ignored it: charged the chunk term of
    16-64 it does not incur, 19 of its 25 bfloat16 cases were out_of_domain (session 25). The note says how a
    kernel that does not chunk says so, and that way its case is judged."""
    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    sequential = registry.get("intree.sequential_ssd").callable()

    def loop(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False):
        return sequential(x, dt, A, B, C, None, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)

    def loop_taking_a_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False):
        return loop(x, dt, A, B, C, None, D, z, dt_bias, dt_softplus)

    caps, notes = capabilities_from_signature(loop, "ssd")
    assert caps.chunk_sizes is None and not any("chunk" in n for n in notes)
    problem = Problem(family="ssd", length=200, dtype="bfloat16", regime="strong_decay", seed=0, groups=1, heads=2,
                      dv=4, state=4)
    options = RunOptions(timeout_s=None, isolation="in-process")
    judged = run_case(user_kernel_spec(loop, family="ssd"), problem, options)
    charged = run_case(user_kernel_spec(loop_taking_a_chunk, family="ssd"), problem.replace(chunk_size=64), options)
    assert judged["verdict"] == "equivalent" and judged["cond_max"] < 0.5, judged["why"]
    assert (charged["verdict"], charged["domain_cause"]) == ("out_of_domain", "precision_exhausted"), charged["why"]
