"""What every contract check of the conformance suite shares: :class:`Check` (one contract),
:class:`ConformanceError` (a broken one), :class:`ConformanceReport` (what a run checked) and
the helpers that run a list of checks and describe the exceptions a plugin raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Relative slack when comparing two accountant answers that must be ordered.
ORDER_RTOL = 1e-9


class ConformanceError(AssertionError):
    """A plugin broke a contract of the conformance suite.

    Attributes
    ----------
    contract
        Which contract (e.g. ``"no leak of private data"``).
    plugin
        The mechanism or accountant checked.
    """

    def __init__(self, contract: str, plugin: str, *, expected: str, happened: str, fix: str):
        self.contract = contract
        self.plugin = plugin
        super().__init__(
            f"[{contract}] {plugin}: expected {expected}; but {happened}.\nWhat to change: {fix}"
        )


@dataclass(frozen=True)
class Check:
    """One contract of the suite, runnable on its own (``check()``); ``str(check)`` is its name,
    usable as a pytest id."""

    name: str
    run: Callable[[], str | None]

    def __call__(self) -> str | None:
        """Run the check; return None when it ran, or why it was skipped."""
        return self.run()

    def __str__(self) -> str:
        return self.name


@dataclass
class ConformanceReport:
    """What :func:`check_mechanism` or :func:`check_accountant` checked.

    Attributes
    ----------
    plugin
        The mechanism or accountant's name.
    passed
        Names of the checks that ran and passed.
    skipped
        Checks that did not apply, with the reason.
    """

    plugin: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def run_all(plugin: str, checks: Sequence[Check]) -> ConformanceReport:
    report = ConformanceReport(plugin)
    for check in checks:
        reason = check()
        if reason is None:
            report.passed.append(check.name)
        else:
            report.skipped[check.name] = reason
    return report


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
