"""Noise-aware TARP studies: is a mechanism's private posterior calibrated for this model?

:func:`tarp` repeats, for k = 1..K, with independent seeds:

1. θ_k ~ p(θ), the model's prior;
2. D_k ~ p(D | θ_k), N records of the model's likelihood, given covariates the user supplies;
3. the mechanism's fit on D_k, with the plan (noise level) it would have on N records;
4. S draws from its private posterior, in the unconstrained space;

and scores the draws against θ_k with :func:`dpppl.diagnostics.tarp_coverage` (NA-DPVI paper,
eqs. A62–A63 and 27).  The study computes only on simulated data, so it spends no privacy
budget, unless the user explicitly lets it use the model's private covariates: then the
diagnostic is marked as not private, and :func:`add_tarp` refuses to put it into a result.
Otherwise the study reads the private records only as every fit does, to find them and check
that they are finite (:func:`dpppl.model.record_model`).

The replicates run on :func:`dpppl.diagnostics.executors.map_chunks`: local processes by default, a
``dask.distributed`` cluster when given a client.  The private records never leave this process:
workers get a copy of the model without them (:func:`dpppl.model.record_structure.without_records`) and a
mechanism made afresh from its class and options.  The copy keeps the model's structure, its
non-record ``pm.Data`` and the coordinates of its other dimensions: dpppl treats those as public
model structure, so they must not be derived from the private data.  Only
``use_private_covariates=True`` sends private data to the workers: the model's covariates.  Each
worker compiles the model once.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from dpppl.diagnostics import (
    plot_coverage,
    plot_coverage_error,
    plot_marginal_coverage,
    save_png,
    tarp_coverage,
)
from dpppl.diagnostics.executors import check_executor, map_chunks
from dpppl.diagnostics.replicates import (
    Covariates,
    Replicates,
    ReplicateSeeds,
    children,
    covariates_for,
    remote_runner,
    root_seed,
)
from dpppl.engine import plan_fit
from dpppl.errors import InvalidDataError, InvalidPrivacyParameterError, PrivacyWarning
from dpppl.model.record_model import RecordModel, record_model
from dpppl.model.simulation import Simulator, simulator
from dpppl.plugin.mechanism import PrivacyPlan
from dpppl.plugin.registry import get_mechanism
from dpppl.privacy.budget import check_epsilon_delta
from dpppl.results import PrivacyMetadata
from dpppl.version import __version__

#: Simulations of a study when the user names no number (the paper's tables use 500).
DEFAULT_SIMULATIONS = 200

NO_BUDGET_SPENT = (
    "No privacy budget was spent: the mechanism ran only on data sets simulated from the model "
    "(parameters from its prior, records from its likelihood) with public or synthetic "
    "covariates; no private record entered its computations or left the process."
)
PRIVATE_DATA_USED = (
    "NOT PRIVATE: the simulated data sets used the model's own (private) covariates and record "
    "count. This diagnostic is not covered by any privacy guarantee; keep it out of any release."
)


def tarp(
    model: pm.Model | None = None,
    *,
    mechanism: str,
    epsilon: float,
    delta: float,
    n_simulations: int = DEFAULT_SIMULATIONS,
    covariates: Covariates | None = None,
    n_records: int | None = None,
    use_private_covariates: bool = False,
    records: str | None = None,
    accountant: str | None = None,
    n_posterior_draws: int | None = None,
    alpha: ArrayLike | None = None,
    references: str = "posterior_uniform",
    n_repeats: int = 20,
    reference_scale: float = 4.0,
    metric: str = "euclidean",
    client: Any = None,
    n_workers: int | None = None,
    batch_size: int | None = None,
    random_seed: int | np.random.SeedSequence | None = None,
    progressbar: bool = True,
    **options: Any,
) -> xr.Dataset:
    """Noise-aware TARP coverage of a mechanism's private posterior, on simulated data.

    Draws K = ``n_simulations`` parameters θ_k from the model's prior and a data set of N records
    from the model given each θ_k, fits the mechanism on each (planned for N records at the
    given ε, δ), and measures how often the private posterior's balls around a reference point
    cover θ_k: the expected coverage C(α), joint and per coordinate of the unconstrained θ, its
    error C(α) − (1 − α) and the RMSE of that error, mean ± std over repeated reference draws.

    Used like :func:`dpppl.sample`: inside ``with model:`` or with ``model=``.

    Parameters
    ----------
    model
        The PyMC model; taken from the ``with`` context when None.
    mechanism, epsilon, delta, accountant, **options
        The mechanism, guarantee, accountant and mechanism options, as in :func:`dpppl.sample`.
    n_simulations
        K, the number of simulated data sets.
    covariates
        The covariates of the simulated data sets, for a model that has any: a dict of arrays,
        one per covariate the model reads (public or synthetic data; N is their length), or a
        function ``rng -> dict`` that simulates them (called once per data set, with a
        ``numpy.random.Generator``; every call must give the same N).  Leave None for a model
        without covariates.
    n_records
        N, the number of records per simulated data set.  Without covariates it defaults to the
        model's N (public metadata: it is published with every result).
    use_private_covariates
        Simulate with the model's own covariates and N.  They are private data: the study
        warns, is marked as not private, and cannot be attached to a result; and they are sent
        to the worker processes or cluster, unless ``n_workers=1``.
    records
        Name of the record dimension; found from the observed variables when None.
    n_posterior_draws
        S, posterior draws used per simulation (evenly thinned from the mechanism's); all of
        them when None.
    alpha, references, n_repeats, reference_scale, metric
        Options of :func:`dpppl.diagnostics.tarp_coverage`: the α grid (default
        :data:`~dpppl.diagnostics.DEFAULT_ALPHA`), the reference rule, how many times it draws
        the references, its width and the distance.
    client
        A ``dask.distributed.Client``: the replicates run on its cluster.  Workers (local or
        Dask) get the model without its records (see :func:`dpppl.model.record_structure.without_records`).
    n_workers
        Local worker processes when no client is given (default: the CPUs available, or 1 when
        JAX computes on a GPU), each pinned to its own share of the CPUs (see
        :mod:`dpppl.threads`).
        ``n_workers=1`` runs everything in this process.  Worker processes start with
        ``spawn``: a script must guard its entry point with ``if __name__ == "__main__":``.
    batch_size
        Most replicates fitted at once, as one vectorised program where the mechanism has one
        (:meth:`~dpppl.Mechanism.fit_replicates`); None takes the mechanism's largest batch for
        JAX's default device, 1 fits them one at a time.  The study runs in the fewest equal
        batches within it (40 under 16: three of 14), the last filled up to the others' size
        with copies of its last replicate, whose fits are dropped, so that a vectorised
        mechanism compiles one program for the study.  Batches are the same on every executor,
        so the study's numbers do not depend on where it runs.  A replicate's random stream depends on
        its batch, so with None a study on a GPU, which gets larger batches, is statistically
        the same as on a CPU but not identical: give ``batch_size`` to reproduce one exactly.
    random_seed
        Seed of the whole study (prior draws, data, fits, references).  The study computes on
        no private data, so its seed is stored in the attributes for reproducibility.
    progressbar
        Show a bar over the replicates.

    Returns
    -------
    xarray.Dataset
        The output of :func:`dpppl.diagnostics.tarp_coverage` (variables ``ecp``,
        ``coverage_error``, ``rmse``, their ``marginal_*`` versions and the ball masses, with
        dims ``repeat``, ``alpha``, ``parameter``, ``simulation``; and ``interval_coverage``,
        how often each parameter's central credible intervals held the truth), plus ``fit_warnings``
        (dim ``simulation``: what each fit warned of, one message per line, empty where it did
        not; the study itself warns once, naming the first), with attributes recording the
        study's settings (mechanism, options, ε, δ, N, K, S, seed), ``fits_with_warnings``,
        and ``privacy_budget_spent`` and ``privacy_note`` saying what the study spent.  Ready to
        be a result's ``tarp`` group (see :func:`add_tarp`).

    Raises
    ------
    InvalidDataError
        If the model has covariates and none are given (nor the private opt-in), or the
        covariates do not fit the model.
    ModelNotSupportedError
        If the model cannot be simulated from (a ``pm.Potential``), or the mechanism refuses it.
    """
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    check_executor(client, n_workers)
    _check_positive("n_simulations", n_simulations, minimum=2)
    if n_posterior_draws is not None:
        _check_positive("n_posterior_draws", n_posterior_draws)
    if batch_size is not None:
        _check_positive("batch_size", batch_size)
    mechanism_obj = get_mechanism(mechanism)(**options)
    compiled = record_model(model, records, hold_model=False)
    sim = simulator(compiled)
    root = root_seed(random_seed)
    *seeds, reference_seed = children(root, n_simulations + 1)
    source, n, kind = _resolve_covariates(
        compiled, sim, covariates, n_records, use_private_covariates, seeds[0]
    )
    simulated = compiled.with_n_records(n)
    plan, _ = plan_fit(
        mechanism_obj, simulated, epsilon=epsilon, delta=delta, accountant=accountant
    )
    batch_size = equal_batches(
        n_simulations, batch_size or mechanism_obj.replicate_batch_size(simulated, plan)
    )
    replicates = Replicates(
        simulated, sim, mechanism_obj, plan, source, n, n_posterior_draws, batch_size
    )
    chunks = map_chunks(
        seeds,
        batch=batch_size,
        local=replicates.run,
        remote=remote_runner(compiled, type(mechanism_obj), options, replicates),
        client=client,
        n_workers=n_workers,
        progressbar=progressbar,
        description=f"TARP: {mechanism} on {n_simulations} simulated data sets",
    )
    truth = np.concatenate([chunk.truth for chunk in chunks])
    samples = np.concatenate([chunk.samples for chunk in chunks])
    fit_warnings = [messages for chunk in chunks for messages in chunk.warnings]
    _report_fit_warnings(fit_warnings)
    coverage = tarp_coverage(
        samples,
        truth,
        alpha=alpha,
        references=references,
        n_repeats=n_repeats,
        reference_scale=reference_scale,
        metric=metric,
        parameter_names=compiled.parameters.labels(),
        random_seed=np.random.default_rng(reference_seed),
    )
    coverage["fit_warnings"] = (
        "simulation",
        np.array(["\n".join(messages) for messages in fit_warnings], dtype=object),
        {"long_name": "what each fit warned of, one message per line (empty: nothing)"},
    )
    coverage.attrs.update(
        _study_attrs(
            mechanism=mechanism,
            settings=mechanism_obj.settings(),
            plan=plan,
            epsilon=epsilon,
            n_records=n,
            covariates=kind,
            seed=root,
            seeded=random_seed is not None,
            fits_with_warnings=sum(1 for messages in fit_warnings if messages),
            batch_size=batch_size,
        )
    )
    return coverage


def _resolve_covariates(
    model: RecordModel,
    sim: Simulator,
    covariates: Covariates | None,
    n_records: int | None,
    use_private_covariates: bool,
    first_seed: np.random.SeedSequence,
) -> tuple[Covariates | None, int, str]:
    """Where the simulated data sets get their covariates, N, and how to describe the source.

    Returns the covariates (checked arrays, a simulator, or None), N, and one of ``"none"``,
    ``"given"``, ``"simulated"`` or ``"private"``.  A simulator is called once here, with the
    first replicate's seed, to learn N and check what it returns.
    """
    if use_private_covariates:
        if covariates is not None or n_records is not None:
            raise InvalidDataError(
                "use_private_covariates=True takes the model's own covariates and N; do not give "
                "covariates= or n_records= with it"
            )
        warnings.warn(
            "the TARP study uses the model's private covariates and record count: its result is "
            "not private and must not be released (dpppl.add_tarp refuses to attach it), and "
            "unless n_workers=1 the covariates are sent to its worker processes or Dask cluster",
            PrivacyWarning,
            stacklevel=3,
        )
        private = {name: model.data()[name] for name in sim.covariate_names}
        return sim.check_covariates(private, model.n_records), model.n_records, "private"
    if covariates is None:
        _require_covariate_free(sim)
        n = model.n_records if n_records is None else n_records
        sim.check_covariates(None, n)
        return None, int(n), "none"
    if callable(covariates):
        # The first replicate's own covariate seed: the probe draws what that replicate will.
        probe_seed = ReplicateSeeds(*children(first_seed, 4)).covariates
        first = sim.check_covariates(covariates_for(covariates, probe_seed), n_records)
        return covariates, _length(first), "simulated"
    checked = sim.check_covariates(covariates, n_records)
    return checked, _length(checked), "given"


def _require_covariate_free(sim: Simulator) -> None:
    if sim.covariate_names:
        raise InvalidDataError(
            f"the model reads covariates {list(sim.covariate_names)}, which are private data "
            "like the observations, so a TARP study does not take them from the model. Give "
            "covariates=: a dict of public or synthetic arrays (N records each), or a function "
            "rng -> dict that simulates them; or, for a diagnostic you will not release, opt in "
            "with use_private_covariates=True"
        )


def add_tarp(
    result: xr.DataTree,
    model: pm.Model | None = None,
    *,
    coverage: xr.Dataset | None = None,
    **tarp_options: Any,
) -> xr.DataTree:
    """Add a ``tarp`` group to a result of :func:`dpppl.sample`.

    Runs :func:`tarp` for the mechanism, options, ε, δ and accountant the result records in its
    ``dp_*`` attributes (or attaches a study already run, ``coverage=``), and stores it as the
    result's ``tarp`` group, which survives ``to_netcdf``.

    Parameters
    ----------
    result
        A result of :func:`dpppl.sample`; changed in place.
    model
        The PyMC model the result was fitted with; taken from the ``with`` context when None.
    coverage
        A study from :func:`tarp` to attach instead of running one; it must be for the result's
        mechanism, options, ε and δ.
    **tarp_options
        Options of :func:`tarp` (``covariates``, ``n_simulations``, ``client``...), except the
        mechanism's, which come from the result.

    Returns
    -------
    xarray.DataTree
        ``result``, with its ``tarp`` group.

    Raises
    ------
    InvalidPrivacyParameterError
        If the study used the model's private covariates (``use_private_covariates=True``): it
        is not private and a result is meant for release.
    ValueError
        If ``result`` carries no dpppl privacy metadata, or ``coverage`` is for another setting.
    """
    setting = _result_setting(result)
    if coverage is None:
        check_study(record_model(model, tarp_options.get("records")), tarp_options)
        coverage = tarp(model, **setting, **tarp_options)
    _check_attachable(coverage, setting)
    result["tarp"] = xr.DataTree(coverage)
    return result


def check_study(model: RecordModel, tarp_options: Mapping[str, Any]) -> None:
    """Refuse, before any fit, TARP options that cannot give a study to attach to a result.

    Raises
    ------
    TypeError
        For an option :func:`tarp` does not have, or one that fixes the mechanism's setting
        (that comes from the result).
    InvalidPrivacyParameterError
        For ``use_private_covariates=True``: such a study is not private.
    InvalidDataError
        If the model has covariates and ``covariates=`` is missing or does not fit it.
    ModelNotSupportedError
        If the model cannot be simulated from.
    """
    unknown = sorted(set(tarp_options) - _STUDY_OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown TARP option(s) {unknown}; the options are {sorted(_STUDY_OPTIONS)} (the "
            "mechanism, its options, epsilon and delta are those of the result)"
        )
    if tarp_options.get("use_private_covariates"):
        raise InvalidPrivacyParameterError(
            "a TARP study with use_private_covariates=True is not private, so it cannot become "
            "part of a result meant for release; give public or synthetic covariates=, or run "
            "dpppl.tarp(...) on its own and keep its output private"
        )
    sim = simulator(model)
    covariates = tarp_options.get("covariates")
    if covariates is None:
        _require_covariate_free(sim)
    elif not callable(covariates):
        sim.check_covariates(covariates, tarp_options.get("n_records"))


def plot_tarp(
    tarp_result: xr.Dataset | xr.DataTree,
    path: str | Path | None = None,
    *,
    title: str | None = None,
) -> Figure:
    """One figure of a TARP study: joint coverage, its error, and every marginal coverage.

    Parameters
    ----------
    tarp_result
        The output of :func:`tarp`, or a result with a ``tarp`` group.
    path
        Where to save the figure as PNG (folders are created); not saved when None.
    title
        The figure's title; by default the mechanism, ε, δ, N and K of the study.

    Returns
    -------
    matplotlib.figure.Figure
    """
    study = _tarp_group(tarp_result)
    n_params = study.sizes["parameter"]
    # At least two columns, so that one parameter's panel is as wide as each joint one.
    n_cols = max(2, min(n_params, 4))
    n_rows = math.ceil(n_params / n_cols)
    fig = Figure(figsize=(2.6 * n_cols + 1.5, 5.0 + 2.8 * n_rows), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(5.0, 2.8 * n_rows))
    joint_axes = top.subplots(1, 2)
    plot_coverage(study, ax=joint_axes[0])
    plot_coverage_error(study, ax=joint_axes[1])
    top.suptitle(_plot_title(study.attrs) if title is None else title)
    grid = bottom.subplots(n_rows, n_cols, sharex=True, sharey=True, squeeze=False).ravel()
    for spare in grid[n_params:]:
        spare.set_visible(False)
    plot_marginal_coverage(study, axes=grid[:n_params])
    # plot_marginal_coverage labels the whole figure; here its panels are only the lower part.
    fig.supxlabel("")
    fig.supylabel("")
    bottom.suptitle("marginal coverage of each unconstrained parameter", fontsize="medium")
    bottom.supxlabel("credibility level 1 − α", fontsize="medium")
    bottom.supylabel("C(α)", fontsize="medium")
    if path is not None:
        save_png(fig, path)
    return fig


def _tarp_group(tarp_result: xr.Dataset | xr.DataTree) -> xr.Dataset:
    if isinstance(tarp_result, xr.Dataset):
        return tarp_result
    if "tarp" in tarp_result.children:
        return tarp_result["tarp"].to_dataset()
    if "ecp" in tarp_result.data_vars:
        return tarp_result.to_dataset()
    raise ValueError("no TARP study here: pass the output of dpppl.tarp or a result with 'tarp'")


def _plot_title(attrs: Mapping[str, Any]) -> str:
    parts = [f"TARP: {attrs.get('mechanism', 'posterior')}"]
    if "epsilon" in attrs:
        parts.append(f"ε = {float(attrs['epsilon']):g}, δ = {float(attrs['delta']):g}")
    parts.append(f"N = {attrs['n_records']}" if "n_records" in attrs else "")
    parts.append(f"K = {int(attrs['n_simulations'])}")
    return ", ".join(p for p in parts if p)


def _result_setting(result: xr.DataTree) -> dict[str, Any]:
    meta = PrivacyMetadata.from_result(result)
    return {
        "mechanism": meta.mechanism,
        "epsilon": meta.epsilon,
        "delta": meta.delta,
        "accountant": meta.accountant,
        **meta.mechanism_settings,
    }


def _check_attachable(coverage: xr.Dataset, setting: Mapping[str, Any]) -> None:
    attrs = coverage.attrs
    if int(attrs.get("uses_private_data", 1)):
        raise InvalidPrivacyParameterError(
            "this TARP study used private data (use_private_covariates=True, or it carries no "
            "dpppl statement that it did not): it is not private and cannot become part of a "
            "result meant for release; keep it separate"
        )
    settings = json.loads(attrs["mechanism_settings"])
    options = {k: v for k, v in setting.items() if k not in _SETTING_KEYS}
    same = (
        attrs["mechanism"] == setting["mechanism"]
        and settings == options
        and math.isclose(float(attrs["epsilon"]), setting["epsilon"], rel_tol=1e-2)
        and math.isclose(float(attrs["delta"]), setting["delta"], rel_tol=1e-2)
    )
    if not same:
        raise ValueError(
            f"this TARP study is for {attrs['mechanism']} {settings} at ε={attrs['epsilon']}, "
            f"δ={attrs['delta']}; the result is {setting['mechanism']} {options} at "
            f"ε={setting['epsilon']}, δ={setting['delta']}"
        )


_SETTING_KEYS = ("mechanism", "epsilon", "delta", "accountant")
_STUDY_OPTIONS = frozenset(
    name
    for name, parameter in inspect.signature(tarp).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in _SETTING_KEYS
)


def equal_batches(count: int, limit: int) -> int:
    """The size of the fewest equal batches of at most ``limit`` that hold ``count`` items."""
    batches = -(-count // max(1, limit))
    return -(-count // batches)


def _study_attrs(
    *,
    mechanism: str,
    settings: dict[str, Any],
    plan: PrivacyPlan,
    epsilon: float,
    n_records: int,
    covariates: str,
    seed: np.random.SeedSequence,
    seeded: bool,
    fits_with_warnings: int,
    batch_size: int,
) -> dict[str, Any]:
    private = covariates == "private"
    attrs = {
        "mechanism": mechanism,
        "mechanism_settings": json.dumps(settings, sort_keys=True),
        "epsilon": float(epsilon),
        "delta": float(plan.delta),
        "planned_epsilon": float(plan.epsilon),
        "accountant": plan.accountant or "none",
        "n_records": int(n_records),
        "covariates": covariates,
        "space": "unconstrained",
        "simulation": "theta_k from the model's prior, data from the model given theta_k, the "
        "mechanism fitted on each simulated data set with the noise planned for n_records",
        "privacy_budget_spent": "not private" if private else "none",
        "privacy_note": PRIVATE_DATA_USED if private else NO_BUDGET_SPENT,
        "uses_private_data": int(private),
        # The study computes on no private data, so its seed may be kept: with it the study
        # reruns.
        "seed_entropy": str(seed.entropy),
        # Vectorised replicates draw their randomness per batch: the seed reruns the study with
        # the same batches.
        "batch_size": int(batch_size),
        "seed_spawn_key": json.dumps(list(seed.spawn_key)),
        "seeded": int(seeded),
        "fits_with_warnings": int(fits_with_warnings),
        "dpppl_version": __version__,
    }
    if plan.noise_multiplier is not None:
        attrs["noise_multiplier"] = float(plan.noise_multiplier)
    return attrs


def _report_fit_warnings(fit_warnings: list[list[str]]) -> None:
    warned = [messages for messages in fit_warnings if messages]
    if warned:
        warnings.warn(
            f"{len(warned)} of {len(fit_warnings)} fits of the TARP study warned; the first "
            f"said: {'; '.join(warned[0])}",
            UserWarning,
            stacklevel=3,
        )


def _check_positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _length(covariates: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(covariates.values())).shape[0])
