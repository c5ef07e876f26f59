"""The harness's one exception hierarchy.

`HarnessError` is the root of everything the harness raises on purpose. `InvalidArgument` is a bad
argument from a user (it names the argument, the value and what was expected). `KernelUnavailable`
says why an adapter cannot run here (package missing, needs CUDA, ...). `KernelContractError` is a
kernel that broke its family's contract. `DivergenceError` is an `AssertionError`, so pytest shows
it as a test failure with the message a person can act on.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class of every error the harness raises deliberately."""


class InvalidArgument(HarnessError, ValueError):
    """A caller passed an argument the harness cannot use.

    Messages follow one form: ``f"{name}={value!r} {what is wrong}; {what was expected}"``.
    """


class ProblemTooLarge(InvalidArgument):
    """A problem whose inputs exceed `harness.problems.MAX_PROBLEM_ELEMENTS` (a search skips such a
    draw, a case file or a sweep naming one is refused)."""


class KernelUnavailable(HarnessError):
    """An adapter cannot run on this machine; ``reason`` says why (shown by ``harness list``)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class KernelContractError(HarnessError):
    """A kernel broke its family's contract (wrong shape/dtype/device, mutated inputs, ...).

    ``outcome`` is the machine-readable name of the violation (see `harness.kernels.contract.Outcome`).
    """

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome


class DivergenceError(HarnessError, AssertionError):
    """A kernel's output is not equivalent to its oracle; raised by `assert_equivalent`."""
