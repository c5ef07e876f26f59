# Numerical-equivalence harness: set-up, tests, reports, sweeps, benchmarks.
# `make install && make report` is the main job on its defaults; `make test` is the CI gate.

PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# The CPU build of torch. On a machine without torch this is what gets installed (an unpinned torch
# would pull a multi-GB CUDA build); a machine that already has torch (a GPU box) keeps its own.
TORCH_CPU ?= torch==2.13.0
# Third-party kernels driven through adapters. --no-deps: torchscale declares fairscale and timm, which
# the retention code never uses and which drag a large tree (see docs/adapters.md); triton provides
# the interpreter that runs fla's and accelerated-scan's Triton kernels on the CPU.
THIRD_PARTY ?= mambapy==1.2.0 torchscale==0.3.0 yet-another-retnet==0.5.1 accelerated-scan==0.3.1 \
               fla-core==0.6.0 einops==0.8.2
# A CUDA torch brings the triton it was built with; only a CPU-only machine gets this one (interpreter).
TRITON ?= triton==3.9.0
# mamba-ssm's pure-torch reference (selective_scan_ref) as a benchmark peer: its package builds without
# the CUDA extension when told to, into a folder of its own (never the project's environment, where the
# mamba-ssm adapters would then find a package that cannot run); see docs/performance.md.
BENCH_PEERS ?= .bench-peers
MAMBA_SSM ?= mamba-ssm==2.3.2.post1
# The GPU machine has no network and none of the third-party kernel packages: `make device-bundle` puts
# them, pure Python (wheels for any Python 3, so also 3.12), pinned and --no-deps, into this ignored folder,
# which scripts/gpu_check.sh puts on PYTHONPATH (docs/gpu.md). mamba-ssm is built without its CUDA extension.
DEVICE_BUNDLE ?= .device-bundle
DEVICE_PACKAGES ?= mambapy==1.2.0 torchscale==0.3.0 yet-another-retnet==0.5.1 accelerated-scan==0.3.1 fla-core==0.6.0
PYTEST_WORKERS ?= 2
RUN ?= reports/latest
PROFILE ?= ci

.PHONY: install install-kernels install-mamba-ssm bench-peers device-bundle test test-all test-numeric-paths test-install test-triton-other test-fast test-gpu test-gpu-dry report sweep seeds bench gate baseline calibrate calibrate-nightly clean

install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_CPU)"
	$(PIP) install -e ".[test]"
	$(MAKE) install-kernels
	$(PYTHON) scripts/warm_oracles.py  # the oracles' numba kernels compiled once into their cache, not in each test worker

install-kernels:
	$(PIP) install --no-deps $(THIRD_PARTY)
	$(PYTHON) -c "import triton" 2>/dev/null || $(PIP) install --no-deps "$(TRITON)"

# mamba-ssm built without its CUDA extension, into this environment, so that its Triton kernels (selective_state_update,
# mamba_chunk_scan_combined) run here through the corrected Triton interpreter (docs/adapters.md). Not part of
# `make install`: PyPI has only its source (built here with --no-build-isolation against the installed torch), and
# a machine that already has mamba-ssm (a CUDA build) keeps it.
install-mamba-ssm:
	@if $(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('mamba_ssm') is None)"; then \
	  echo "install-mamba-ssm: mamba-ssm is already installed here; left as it is"; \
	else MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE $(PIP) install --no-deps --no-build-isolation "$(MAMBA_SSM)"; fi

# Two tiers. `make test`, the README's test command: every unit test and every kernel's property search at
# the ci profile (at most about 3 minutes on 2 idle cores). `make test-all`: that, then the end-to-end tier
# (tests marked `e2e`: CLI and pytest runs in subprocesses, the GPU run rehearsed on the CPU, interpreted
# mamba-ssm gradients and the like; at most about 10 minutes in all). `make test-numeric-paths`: the tests that
# judge real runs' numbers again under another numeric path of the same torch (no vector kernels, MKL's
# compatible code path, one thread), so that a test standing on this CPU's rounding fails here first.
# --dist loadgroup: tests that share a costly module fixture or cache run on one worker (conftest.py).
PYTEST_TIER = $(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --hypothesis-profile=$(PROFILE) \
  --harness-report-dir reports/test-run
test:
	$(PYTEST_TIER) -m "not slow and not e2e"

# The device bundle is best effort: it lets the GPU dry run (tests/test_cuda_path.py) import every package the
# way the GPU machine will; without it (no PyPI here) those checks skip with the reason and the rest runs.
test-all: test
	@test -d $(DEVICE_BUNDLE) || $(MAKE) --no-print-directory device-bundle \
	  || echo "test-all: the device bundle could not be built here; its checks will skip (see docs/gpu.md)"
	$(PYTEST_TIER) -m "e2e and not slow"

NUMERIC_PATH_TESTS ?= tests/test_findings.py tests/test_selective_chunk_term.py tests/test_precision_edge.py \
  tests/test_chunk_rounding_cause.py tests/test_seeds.py tests/test_judgement_end_to_end.py
test-numeric-paths:
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1 $(PYTHON) -m pytest -n $(PYTEST_WORKERS) \
	  --dist loadgroup --hypothesis-profile=$(PROFILE) -p no:cacheprovider -m "not slow" $(NUMERIC_PATH_TESTS)

# The wheel installed outside the checkout, in a new project: init, check, baseline, a failing and a
# passing gate, the default sweep (one shard), the pytest route; nothing written outside the project
# (tests/test_install.py, scripts/install_walkthrough.py; minutes). The walkthrough prints its timings.
test-install:
	$(PYTHON) -m pytest -m slow -s -p no:cacheprovider tests/test_install.py

# The Triton interpreter corrections on the other tested triton (TESTED_TRITON_VERSIONS; fla-core 0.5.x needs
# it): that triton and fla-core 0.5.2 into ignored folders (~600 MB, PyPI), ahead of the installed ones on
# PYTHONPATH, then the interpreter, startup, TF32 and fla adapter tests (docs/adapters.md). Not in CI (size).
OTHER_TRITON ?= 3.5.1
test-triton-other:
	@test -d .triton-$(OTHER_TRITON) || $(PIP) install --quiet --no-deps --target .triton-$(OTHER_TRITON) triton==$(OTHER_TRITON)
	@test -d .fla-0.5.2 || $(PIP) install --quiet --no-deps --target .fla-0.5.2 fla-core==0.5.2
	PYTHONPATH=$(CURDIR)/.triton-$(OTHER_TRITON) $(PYTHON) -m pytest -q -p no:cacheprovider tests/test_triton_interpreter.py \
	  tests/test_triton_startup.py tests/test_tf32_cause.py
	PYTHONPATH=$(CURDIR)/.fla-0.5.2:$(CURDIR)/.triton-$(OTHER_TRITON) $(PYTHON) -m pytest -q -p no:cacheprovider \
	  tests/test_adapters.py -k fla

test-fast:
	$(PYTHON) -m pytest -x -q --hypothesis-profile=dev -m "not thirdparty and not slow"

test-gpu:
	DEVICE_BUNDLE=$(DEVICE_BUNDLE) bash scripts/gpu_check.sh reports/gpu

# The same script end to end on the CPU (tiny grid, the bundle on PYTHONPATH when built): a path, import
# or packaging error shows here, not in the GPU window. tests/test_cuda_path.py runs it too.
test-gpu-dry:
	DEVICE_BUNDLE=$(DEVICE_BUNDLE) PYTHON=$(PYTHON) bash scripts/gpu_check.sh reports/gpu-dry --device cpu --dry-run

device-bundle:
	rm -rf $(DEVICE_BUNDLE).tmp
	$(PIP) install --quiet --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation py \
	  --target $(DEVICE_BUNDLE).tmp $(DEVICE_PACKAGES)
	MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE $(PIP) install --quiet --no-deps --no-compile \
	  --no-build-isolation --target $(DEVICE_BUNDLE).tmp "$(MAMBA_SSM)"
	$(PYTHON) scripts/device_bundle.py $(DEVICE_BUNDLE).tmp
	rm -rf $(DEVICE_BUNDLE) && mv $(DEVICE_BUNDLE).tmp $(DEVICE_BUNDLE)

# A sweep exits 1 when it finds a divergent case: a finding to read in the report, not a failed job.
report:
	rm -rf $(RUN)  # a fresh run each time (harness refuses to reuse a run directory without --append)
	$(PYTHON) -m harness sweep default --report-dir $(RUN) --quiet; test $$? -le 1

sweep:
	rm -rf reports/sweep-$(or $(NAME),default)
	$(PYTHON) -m harness sweep $(or $(NAME),default) --report-dir reports/sweep-$(or $(NAME),default); test $$? -le 1

seeds:
	rm -rf reports/mamba-seed reports/retnet-seed
	$(PYTHON) -m harness sweep mamba_seed --report-dir reports/mamba-seed --quiet; test $$? -le 1
	$(PYTHON) -m harness sweep retnet_seed --report-dir reports/retnet-seed --quiet; test $$? -le 1

bench: bench-peers
	BENCH_PEERS=$(BENCH_PEERS) $(PYTHON) -m harness.bench --out reports/bench

# Best effort: without it (no network, a build failure) the bench lists the peer as skipped, with why.
bench-peers:
	@test -d $(BENCH_PEERS)/mamba_ssm || MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
	  $(PIP) install --quiet --no-deps --no-build-isolation --target $(BENCH_PEERS) "$(MAMBA_SSM)" \
	  || echo "bench-peers: $(MAMBA_SSM) could not be built here; the bench will skip it"

# The gate compares the default sweep (`make report`) with the committed baseline, made from the same
# sweep by `make baseline`: run that, and commit reports/baseline/, to accept an intended change.
gate: report
	$(PYTHON) -m harness gate $(RUN) --baseline reports/baseline

baseline:
	rm -rf reports/baseline-run
	$(PYTHON) -m harness sweep default --report-dir reports/baseline-run --quiet; test $$? -le 1
	$(PYTHON) -m harness update-baseline reports/baseline-run --baseline reports/baseline

calibrate:
	$(PYTHON) scripts/calibrate.py --cases 100

# The issue-19 bar: 2,000 nightly-profile problems per (family, dtype) on every correct kernel available
# here, in tree and third-party, with zero divergent verdicts (days on 2 cores for the gated families;
# CALIBRATE_SECONDS caps it, and the table says how many problems were run). As a CI matrix: job K of N
# runs CALIBRATE_SHARD=K/N (records reports/calibration-nightly-K.jsonl), and
# `python scripts/calibrate.py --profile nightly --cases 2000 --from-records reports/calibration-nightly-*.jsonl`
# writes the tables of the whole run (docs/calibration.md).
CALIBRATE_SECONDS ?=
CALIBRATE_SHARD ?=
calibrate-nightly:
	$(PYTHON) scripts/calibrate.py --profile nightly --cases 2000 --third-party --no-planted --states --timeout 900 \
	  $(if $(CALIBRATE_SECONDS),--max-seconds $(CALIBRATE_SECONDS)) $(if $(CALIBRATE_SHARD),--shard $(CALIBRATE_SHARD)) \
	  --records reports/calibration-nightly$(if $(CALIBRATE_SHARD),-$(firstword $(subst /, ,$(CALIBRATE_SHARD)))).jsonl

clean:
	rm -rf reports/latest reports/test-run reports/sweep-* reports/*-seed reports/check-* .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
