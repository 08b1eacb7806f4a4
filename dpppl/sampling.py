"""``dpppl.sample``: the user's entry point, shaped like ``pm.sample``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr

from dpppl.diagnostics.study import add_tarp, check_study
from dpppl.engine import plan_fit, run_mechanism
from dpppl.ledger import PrivacyLedger
from dpppl.model.record_model import RecordModel, record_model
from dpppl.plugin.registry import get_mechanism, provider
from dpppl.privacy.budget import check_epsilon_delta
from dpppl.results import build_result, privacy_attrs


def sample(
    model: pm.Model | None = None,
    *,
    mechanism: str,
    epsilon: float,
    delta: float,
    records: str | None = None,
    accountant: str | None = None,
    ledger: PrivacyLedger | None = None,
    random_seed: int | np.random.SeedSequence | None = None,
    progressbar: bool = True,
    tarp: bool | dict[str, Any] | None = None,
    **options: Any,
) -> xr.DataTree:
    """Draw from a differentially private posterior of a PyMC model.

    Used like ``pm.sample``: inside ``with model:`` or with ``model=``.  Every check (model
    structure, data, ε, δ, options, budget) runs before the data are touched.

    Parameters
    ----------
    model
        The PyMC model, or a ``bambi.Model`` built with ``auto_scale=False``; taken from the
        ``with`` context when None.
    mechanism
        Name of an installed mechanism plugin (``dpppl plugins`` lists them), e.g. ``"na-dpvi"``.
    epsilon, delta
        The privacy guarantee to meet: ε > 0, 0 < δ < 1 (and δ well below 1/N).
    records
        Name of the record dimension; found from the observed variables when None.
    accountant
        Name of an installed accountant plugin; the mechanism's preferred one when None.
    ledger
        A :class:`PrivacyLedger` to charge; the fit is refused if it would exceed the budget.
    random_seed
        Fixes every random draw, for reproducibility only: a result is private only while its
        seed is secret, so leave it None (OS entropy) for anything you publish.
    progressbar
        Show progress bars on long loops.
    tarp
        Also run a noise-aware TARP study of the mechanism on simulated data after the fit and
        add it as the ``tarp`` group (see :func:`dpppl.add_tarp`): True for the defaults, or a
        dict of :func:`dpppl.tarp` options (``covariates`` for a model with covariates,
        ``n_simulations``, ``client``...).  It spends no privacy budget; its seed is its own
        ``random_seed`` option, never the fit's.
    **options
        Options of the mechanism (see its documentation).

    Returns
    -------
    xarray.DataTree
        ``posterior`` (named and dimensioned like the model), the mechanism's released groups,
        and the guarantee in root attributes ``dp_epsilon``, ``dp_delta``, ``dp_accountant``,
        ``dp_neighbour_relation`` and so on; see :func:`dpppl.privacy_statement`.
    """
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    mechanism_obj = get_mechanism(mechanism)(**options)
    compiled = record_model(model, records, hold_model=False)
    tarp_options = _tarp_request(compiled, tarp, records, progressbar)
    plan, chosen = plan_fit(
        mechanism_obj, compiled, epsilon=epsilon, delta=delta, accountant=accountant
    )
    if ledger is not None:
        ledger.charge(
            plan.event,
            plan.relation,
            label=mechanism,
            epsilon=plan.epsilon,
            delta=plan.delta,
            extra_delta=plan.extra_delta,
            max_divergence=plan.max_divergence,
        )
    release, seeded = run_mechanism(
        mechanism_obj,
        compiled,
        compiled.data(),
        plan,
        random_seed=random_seed,
        progressbar=progressbar,
    )
    providers = {"mechanism": provider("mechanism", mechanism)}
    if plan.accountant is not None:
        providers["accountant"] = provider("accountant", chosen.name)
    attrs = privacy_attrs(
        plan,
        release,
        mechanism=mechanism,
        settings=mechanism_obj.settings(),
        n_records=compiled.n_records,
        seeded=seeded,
        providers=providers,
    )
    for message in release.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    result = build_result(compiled, release, attrs)
    if tarp_options is not None:
        try:
            add_tarp(result, compiled.model, **tarp_options)
        except Exception as error:  # noqa: BLE001 - the budget is spent: never lose the result
            warnings.warn(
                f"the TARP study failed ({error!r}); the result is returned without a 'tarp' "
                "group. Run dpppl.add_tarp(result, model, ...) to try again",
                stacklevel=2,
            )
    return result


def _tarp_request(
    model: RecordModel, tarp: bool | dict[str, Any] | None, records: str | None, progressbar: bool
) -> dict[str, Any] | None:
    """The options of ``sample(tarp=...)``, checked before the fit so that a request that cannot
    be carried out costs no privacy budget."""
    if tarp is None or tarp is False:
        return None
    options = {"progressbar": progressbar, "records": records, **({} if tarp is True else tarp)}
    check_study(model, options)
    return options
