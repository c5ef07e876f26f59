"""Run the seed sweeps and write their answer tables into README.md (between marker comments).

    PYTHONPATH=. python scripts/seed_tables.py            # rewrite the README's generated blocks
    PYTHONPATH=. python scripts/seed_tables.py --check    # exit 1 when the README differs

The tables are what `harness sweep mamba_seed` / `harness sweep retnet_seed` print under their question
(`harness.answers`); ``tests/test_findings.py`` runs the same sweeps and fails when the README's blocks
are not their output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

SEED_SWEEPS = ("mamba_seed", "retnet_seed")


def sweep_records(name: str) -> list[dict]:
    """Every record of the sweep ``name`` (its cases, then its pairs), run in this process."""
    from harness.cases import load_sweep
    from harness.runner import RunOptions, run_cases, run_pairs

    sweep = load_sweep(name)
    return run_cases(sweep.cases(), RunOptions()) + run_pairs(sweep, RunOptions())


def seed_blocks() -> dict[str, str]:
    """The README block of each seed sweep, from a fresh run."""
    from harness.answers import generated_block
    from harness.cases import load_sweep

    return {name: generated_block(name, load_sweep(name).answers, sweep_records(name)) for name in SEED_SWEEPS}


def main(argv: list[str] | None = None) -> int:
    from harness.answers import block_markers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the README differs")
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    text = readme.read_text()
    for name, block in seed_blocks().items():
        begin, end = block_markers(name)
        if begin not in text or end not in text:
            print(f"{readme}: no generated block for {name} (expected the lines {begin!r} ... {end!r})")
            return 1
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        new = head + block + tail
        if new != text and args.check:
            print(f"{readme}: the {name} block differs from `harness sweep {name}`; run scripts/seed_tables.py")
            return 1
        text = new
    if not args.check:
        readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
