"""A process that opens a privacy ledger, waits for the others, then charges it: the worker of
``tests/test_ledger.py``'s concurrency tests.

It is a plain module, not part of the test file, because pytest imports test files by path
(importlib mode) and processes started with ``spawn`` cannot import them again.  It imports
dpppl only inside the function, after choosing which plugins the process loads.
"""

from __future__ import annotations

import os
from typing import Any


def charge_when_released(
    ledger_arguments: dict[str, Any],
    event_json: str,
    fit_epsilon: float,
    label: str,
    barrier: Any,
    results: Any,
) -> None:
    """Open ``PrivacyLedger(**ledger_arguments)``, wait at ``barrier``, charge the event once and
    put ``(label, outcome)`` on ``results``: ε spent after the charge, ``"refused"`` for a
    :class:`~dpppl.errors.PrivacyBudgetExceededError`, or the repr of any other error."""
    # Only the accountant plugin: importing every plugin would cost each process seconds.
    os.environ["DPPPL_LOAD_PLUGINS"] = "dpppl-dp-accounting"
    from dpppl import NeighbourRelation, PrivacyBudgetExceededError, PrivacyLedger
    from dpppl.privacy.events import event_from_json

    try:
        ledger = PrivacyLedger(**ledger_arguments)
        barrier.wait(timeout=120)
        outcome: Any = ledger.charge(
            event_from_json(event_json),
            NeighbourRelation.ADD_OR_REMOVE_ONE,
            label=label,
            epsilon=fit_epsilon,
            delta=ledger.delta,
        )
    except PrivacyBudgetExceededError:
        outcome = "refused"
    except BaseException as error:  # noqa: BLE001 - reported to the test, which fails on it
        barrier.abort()  # the others would otherwise wait for this process until the timeout
        outcome = repr(error)
    results.put((label, outcome))
