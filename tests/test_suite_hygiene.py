"""The suite's asserts hold on any machine: none compares text against a literal holding float digits.

A message's numbers from a real kernel or oracle run differ in their last digits between CPUs (AVX2 vs AVX-512,
MKL's code paths, thread counts), so a test that pins them as text (``"cond 6.05e+14" in message``) fails on
another machine while the kernel is right. Such a test asserts the number itself with a margin, or the verdict
and cause. This guard parses every test module and fails, naming file:line, on an ``assert`` that compares
(``==``, ``!=``, ``in``, ``not in``) against a string literal with float text (`FLOAT_TEXT`). A test whose
inputs are synthetic and exact (a formatting function fed a number the test chose) is listed in `ALLOWED`, each
entry with the reason it cannot differ between machines.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Float text: a decimal with two or more digits after the point, or an exponent (``1.25``, ``6.05e+14``, ``3e9``).
FLOAT_TEXT = re.compile(r"\d\.\d{2,}|\d[eE][+-]?\d")

#: (file from the repository root, test function, the literal) -> why its number is exact on every machine.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("tests/test_gate.py", "test_growth_from_an_exact_zero_is_not_called_non_finite",
     "0 -> 3e+09 (from 0: no finite ratio;"):
        "the gate's records are built in the test with cond 0 and 3e9: the formatting of numbers it chose",
    ("tests/test_findings.py", "test_a_divergent_final_state_is_the_worst_cond_its_line_quotes",
     "worst cond 6.05e+14 (float32 L=64 trained)"):
        "the records are built in the test with final_state_cond_max=6.05e14: the line quotes the number it chose",
    ("tests/test_findings.py", "test_eps_drawn_at_random_is_not_listed_one_by_one",
     "cond 5 at eps 0.001, 6 at 0.0001, 0.3 at eps 0 (the same cases rerun)"):
        "the records are built in the test with these conds and eps: the evidence quotes the numbers it chose",
}


@dataclass(frozen=True)
class FloatTextAssert:
    """One assert comparing against a string literal with float text."""

    path: str
    line: int
    function: str
    literal: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.literal)

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function}): {self.literal!r}"


def _string_literals(node: ast.AST) -> list[str]:
    """The string literals an operand is made of: itself, the text parts of an f-string, the items of a list,
    tuple or set, either side of ``+`` or of a conditional expression."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        return [part.value for part in node.values if isinstance(part, ast.Constant) and isinstance(part.value, str)]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [text for item in node.elts for text in _string_literals(item)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _string_literals(node.left) + _string_literals(node.right)
    if isinstance(node, ast.IfExp):
        return _string_literals(node.body) + _string_literals(node.orelse)
    return []


_TEXT_COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def float_text_asserts(source: str, path: str) -> list[FloatTextAssert]:
    """Every comparison in an ``assert`` statement's test (its message aside) of ``source`` whose operand is a
    string literal with float text, by line."""
    found: list[FloatTextAssert] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Assert):
            for compare in ast.walk(node.test):
                if not isinstance(compare, ast.Compare):
                    continue
                operands = [compare.left, *compare.comparators]
                for op, pair in zip(compare.ops, zip(operands, operands[1:])):
                    if not isinstance(op, _TEXT_COMPARISONS):
                        continue
                    for operand in pair:
                        for literal in _string_literals(operand):
                            if FLOAT_TEXT.search(literal):
                                found.append(FloatTextAssert(path, compare.lineno, function, literal))
            return
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return sorted(set(found), key=lambda f: (f.line, f.literal))


def suite_float_text_asserts() -> list[FloatTextAssert]:
    """`float_text_asserts` of every test module under tests/ but this one (its asserts compare the scan's
    findings on a sample source, float text by design)."""
    here = Path(__file__).resolve()
    return [hit for path in sorted(TESTS.rglob("*.py")) if path.resolve() != here
            for hit in float_text_asserts(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]


def test_no_assert_compares_text_with_float_digits():
    flagged = [hit for hit in suite_float_text_asserts() if hit.key not in ALLOWED]
    assert not flagged, (
        "asserts that compare text with float digits (assert the number with a margin, or the verdict and cause; "
        "a test on synthetic, exact inputs goes in ALLOWED with its reason):\n"
        + "\n".join(str(hit) for hit in flagged))


def test_every_allowed_entry_still_names_an_assert():
    present = {hit.key for hit in suite_float_text_asserts()}
    stale = [key for key in ALLOWED if key not in present]
    assert not stale, f"ALLOWED entries that match no assert any more (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_scan_flags_float_text_in_every_comparison_form():
    source = '''
def test_x(message, lines, n):
    assert "cond 6.05e+14 (bound 1.07e-15)" in message
    assert message == "abs error 0.644"
    assert lines != ["ok", f"worst {n} at 1e-3"]
    assert n > 0 and "ratio 3.33x" not in message, "1.2345 in the assert's message is not compared"
    assert message == "L=64, cond 11, eps 0.3, chunk 16"
    if "2.5e-3" in message:
        pass
'''
    hits = float_text_asserts(source, "t.py")
    assert [(h.line, h.literal) for h in hits] == [
        (3, "cond 6.05e+14 (bound 1.07e-15)"), (4, "abs error 0.644"), (5, " at 1e-3"), (6, "ratio 3.33x")]
    assert {h.function for h in hits} == {"test_x"}
    assert str(hits[1]) == "t.py:4 (test_x): 'abs error 0.644'"
