"""``dpppl demo``: a private Bayesian logistic regression of income on the bundled Adult sample.

>>> result, notes = dpppl.demo.run_demo()                # what `dpppl demo` fits
>>> model = dpppl.demo.demo_model()                      # or the model alone

The data are the 2000 rows of UCI Adult that ship with dpppl
(:func:`dpppl.datasets.load_adult_sample`).  Whether a person's income is above 50K is regressed
on age, education level, weekly working hours and sex.  The continuous features are centred and
scaled by fixed values chosen in advance, not by statistics of the data, so the scaling spends
no privacy budget and a coefficient has a unit that reads the same on any data set.

The libraries that fit the model are imported inside the functions: ``dpppl --help`` reads this
module's settings and should not wait for PyMC and JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pymc as pm
    import xarray as xr

#: Continuous features of the demo: ``column: (centre, scale)``, so that a coefficient is the
#: change in log-odds per 10 years of age, per 3 education levels, per 10 hours a week.
DEMO_SCALING = {"age": (40.0, 10.0), "education-num": (10.0, 3.0), "hours-per-week": (40.0, 10.0)}

#: Simulated data sets of the demo's TARP check: a smoke-size study (real ones use hundreds).
DEMO_SIMULATIONS = 4

#: Mechanism options of ``dpppl demo --smoke``: seconds instead of minutes, for tests only (too
#: few steps for a posterior worth reading).
SMOKE_OPTIONS = {"steps": 100, "posterior": "naive", "draws": 500, "chains": 1}


def demo_features(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The demo's features and 0/1 income labels from Adult rows.

    Rows with a missing value in a column the demo reads are dropped (no row of the bundled
    sample lacks one).

    Returns
    -------
    features : pandas.DataFrame
        Columns ``age``, ``education-num``, ``hours-per-week`` (centred and scaled by
        :data:`DEMO_SCALING`) and ``male`` (1 for ``sex == "Male"``).
    labels : numpy.ndarray
        1 where the income is above 50K.
    """
    import pandas as pd

    from dpppl.datasets import income_labels

    kept = frame.dropna(subset=[*DEMO_SCALING, "sex", "class"])
    features = pd.DataFrame(
        {
            column: (kept[column] - centre) / scale
            for column, (centre, scale) in DEMO_SCALING.items()
        }
    )
    features["male"] = (kept["sex"] == "Male").astype(float)
    return features.astype(float), income_labels(kept)


def demo_model(frame: pd.DataFrame | None = None) -> pm.Model:
    """The demo's logistic regression on ``frame`` (the bundled Adult sample when None).

    ``income_over_50k ~ Bernoulli(logit⁻¹(intercept + X @ w))`` with ``intercept ~ N(0, 2.5²)``
    and ``w ~ N(0, 1)`` per feature; ``X`` is a ``pm.Data`` with dims ``("person", "feature")``.
    """
    import numpy as np
    import pymc as pm

    from dpppl.datasets import load_adult_sample

    features, labels = demo_features(load_adult_sample() if frame is None else frame)
    coords = {"person": np.arange(len(labels)), "feature": list(features.columns)}
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", features.to_numpy(), dims=("person", "feature"))
        intercept = pm.Normal("intercept", 0.0, 2.5)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        pm.Bernoulli("income_over_50k", logit_p=intercept + X @ w, observed=labels, dims="person")
    return model


def run_demo(
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    options: dict[str, Any] | None = None,
    n_simulations: int = DEMO_SIMULATIONS,
    n_workers: int | None = None,
    random_seed: int | None = None,
    progressbar: bool = True,
) -> tuple[xr.DataTree, list[str]]:
    """Fit the demo model with NA-DPVI and check its coverage with a small TARP study.

    Parameters
    ----------
    epsilon, delta
        The privacy guarantee.
    options
        NA-DPVI options; its defaults (the paper's settings: 10^4 DP-SGD steps, NUTS) when
        None, which take a few minutes on two cores with the TARP check.
    n_simulations
        Simulated data sets of the TARP check (0 skips it).  Their covariates are the sample's,
        public here because UCI Adult is public; with private data, give public or synthetic ones.
    n_workers
        Local processes of the TARP check (default: the CPUs available).
    random_seed
        Fixes every draw, for reproducibility only (the result states it).
    progressbar
        Show progress bars.

    Returns
    -------
    result : xarray.DataTree
        The result of :func:`dpppl.sample`, with a ``tarp`` group when the check ran.
    notes : list of str
        What was fitted and how far to trust the check, for the report.
    """
    from dpppl.datasets import load_adult_sample
    from dpppl.sampling import sample
    from dpppl.tarp_study import add_tarp

    options = dict(options or {})
    frame = load_adult_sample()
    model = demo_model(frame)
    result = sample(
        model,
        mechanism="na-dpvi",
        epsilon=epsilon,
        delta=delta,
        random_seed=random_seed,
        progressbar=progressbar,
        **options,
    )
    notes = [
        (
            "dpppl demo: Bayesian logistic regression of income > 50K on age, education level, "
            f"weekly hours and sex, fitted with na-dpvi (options: {options or 'its defaults'}) "
            "to the 2000-row sample of UCI Adult that ships with dpppl (CC BY 4.0; Becker & "
            "Kohavi 1996, UCI Machine Learning Repository)."
        )
    ]
    if n_simulations:
        features, _ = demo_features(frame)
        add_tarp(
            result,
            model,
            covariates={"X": features.to_numpy()},
            n_simulations=n_simulations,
            n_workers=n_workers,
            random_seed=random_seed,
            progressbar=progressbar,
        )
        notes.append(
            f"The coverage check is smoke-size ({n_simulations} simulated data sets; studies use "
            "hundreds): it shows the diagnostic, not a verdict. Its data sets are simulated from "
            "the model with the sample's covariates, which are public here."
        )
    return result, notes
