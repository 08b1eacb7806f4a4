"""``dpppl demo``: a private Bayesian logistic regression of income on the bundled Adult sample.

>>> demo = dpppl.app.demo.run_demo()         # what `dpppl demo` fits: .result, .comparison, .notes
>>> model = dpppl.app.demo.demo_model()      # or the model alone

The data are the 2000 rows of UCI Adult that ship with dpppl
(:func:`dpppl.datasets.load_adult_sample`).  Whether a person's income is above 50K is regressed
on age, education level, weekly working hours and sex.  The continuous features are centred and
scaled by fixed values chosen in advance, not by statistics of the data, so the scaling spends
no privacy budget and a coefficient has a unit that reads the same on any data set.

The demo shows why the posterior must be noise-aware: beside NA-DPVI's noise-aware posterior it
draws the naive one (the last DP-SGD iterate of the same release, as if it had no privacy noise)
and PyMC's non-private NUTS posterior.  The sample is public, so a non-private posterior may be
shown; it is labelled as such and never stored in the private result.

The libraries that fit the model are imported inside the functions: ``dpppl --help`` reads this
module's settings and should not wait for PyMC and JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pymc as pm
    import xarray as xr

#: Continuous features of the demo: ``column: (centre, scale)``, so that a coefficient is the
#: change in log-odds per 10 years of age, per 3 education levels, per 10 hours a week.
DEMO_SCALING = {"age": (40.0, 10.0), "education-num": (10.0, 3.0), "hours-per-week": (40.0, 10.0)}

#: NA-DPVI options of the demo: the paper's 10^4 DP-SGD steps and NUTS post-processing, with
#: 2 × 1000 kept draws instead of 2 × 4000 (ESS in the thousands is plenty for a summary, and the
#: result file stays under 2 MB).
DEMO_OPTIONS = {"draws": 1000}

#: Simulated data sets of the optional TARP check; 0 skips it.  A study of a few data sets
#: cannot tell a calibrated posterior from a miscalibrated one, and hundreds take far longer than
#: a demo (``tutorials/adult_calibration.py`` runs one); the comparison shows the point instead.
DEMO_SIMULATIONS = 0

#: PyMC NUTS settings of the non-private posterior the demo compares with.
NUTS_SETTINGS = {"draws": 1000, "tune": 1000, "chains": 2}

#: Options of ``dpppl demo --smoke``: seconds instead of a minute, for tests only (too few steps
#: and draws for anything worth reading).
SMOKE_OPTIONS = {"steps": 100, "posterior": "naive", "draws": 500, "chains": 1}
SMOKE_NUTS_SETTINGS = {"draws": 500, "tune": 100, "chains": 1}

#: Labels of the posteriors the demo compares: the result (private), the naive posterior of the
#: same release (private), PyMC's NUTS posterior (not private).
RESULT_LABEL = "{posterior} (the result)"
NAIVE = "naive (same release)"
NON_PRIVATE = "NUTS (not private)"
LEGEND = (
    "noise-aware: NA-DPVI's private posterior; naive: q(theta; phi_T) at the last DP-SGD iterate "
    "of the same release, as if it had no privacy noise (NA-DPVI's posterior='naive'); NUTS: "
    "PyMC on the data themselves, NOT private, shown only because the sample is public"
)


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


class DemoRun(NamedTuple):
    """What :func:`run_demo` returns.

    Attributes
    ----------
    result
        The private result of :func:`dpppl.sample`, with a ``tarp`` group when the check ran.
    comparison
        The posteriors compared, by label: the result's, the naive private posterior of the same
        release and the non-private NUTS posterior (the data are public), for the report and the
        terminal.  Only the first is part of the result.
    notes
        What was fitted and how to read it, for the report.
    """

    result: xr.DataTree
    comparison: dict[str, xr.DataTree]
    notes: list[str]


def run_demo(
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    options: dict[str, Any] | None = None,
    nuts: dict[str, Any] | None = None,
    n_simulations: int = DEMO_SIMULATIONS,
    n_workers: int | None = None,
    random_seed: int | None = None,
    progressbar: bool = True,
) -> DemoRun:
    """Fit the demo model with NA-DPVI, and compare with the naive and non-private posteriors.

    Parameters
    ----------
    epsilon, delta
        The privacy guarantee.
    options
        NA-DPVI options (default :data:`DEMO_OPTIONS`).
    nuts
        ``pm.sample`` settings of the non-private posterior (default :data:`NUTS_SETTINGS`).
    n_simulations
        Simulated data sets of an optional TARP check (0 skips it).  Their covariates are the
        sample's, public here because UCI Adult is public; with private data, give public or
        synthetic ones.
    n_workers
        Local processes of the TARP check (default: the CPUs available).
    random_seed
        Fixes every draw, for reproducibility only (the result states it).
    progressbar
        Show progress bars.

    Returns
    -------
    DemoRun
        The private result, the posteriors compared, and notes for the report.
    """
    import numpy as np

    from dpppl.datasets import load_adult_sample
    from dpppl.diagnostics.study import add_tarp
    from dpppl.sampling import sample

    options = dict(DEMO_OPTIONS if options is None else options)
    naive_seed, nuts_seed = (
        [None, None] if random_seed is None else np.random.SeedSequence(random_seed).generate_state(2)
    )
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
    comparison = {
        RESULT_LABEL.format(posterior=options.get("posterior", "noise-aware")): result,
        NAIVE: naive_posterior(result, model, random_seed=naive_seed),
        NON_PRIVATE: non_private_posterior(
            model,
            random_seed=None if nuts_seed is None else int(nuts_seed),
            progressbar=progressbar,
            **(NUTS_SETTINGS if nuts is None else nuts),
        ),
    }
    notes = [
        (
            "dpppl demo: Bayesian logistic regression of income > 50K on age, education level, "
            f"weekly hours and sex, fitted with na-dpvi (options: {options or 'its defaults'}) "
            "to the 2000-row sample of UCI Adult that ships with dpppl (CC BY 4.0; Becker & "
            "Kohavi 1996, UCI Machine Learning Repository)."
        ),
        (
            "The comparison puts the noise-aware private posterior (this result) beside the naive "
            "one, q(theta; phi_T) at the last DP-SGD iterate of the same release (NA-DPVI's "
            "posterior='naive'; no extra privacy spent), and beside PyMC's NUTS posterior, which "
            "is NOT private: it is shown only because this sample of UCI Adult is public, and it "
            "is not stored in the result."
        ),
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
            f"The coverage check has {n_simulations} simulated data sets; it tells calibrated "
            "from miscalibrated posteriors only with hundreds. Its data sets are simulated from "
            "the model with the sample's covariates, which are public here."
        )
    return DemoRun(result, comparison, notes)


def naive_posterior(
    result: xr.DataTree, model: pm.Model, *, random_seed: Any = None
) -> xr.DataTree:
    """NA-DPVI's naive posterior for the release in ``result``: q(θ; φ_T) at the last iterate of
    its DP-SGD trace, as ``posterior="naive"`` would have returned it.

    It reads only the released trace (post-processing: no privacy is spent) and draws as many
    θ as ``result``'s posterior holds.
    """
    import jax.numpy as jnp
    import numpy as np

    from dpppl.model.record_model import record_model
    from dpppl.privacy.noise import jax_key
    from dpppl.results import posterior_tree

    compiled = record_model(model)
    chains, draws = (result["posterior"].sizes[dim] for dim in ("chain", "draw"))
    last = jnp.asarray(result["dpvi_trace"]["phi"].values[-1])
    key = jax_key(np.random.SeedSequence(random_seed))
    theta = np.asarray(compiled.draw_variational(last, key, chains * draws))
    return posterior_tree(compiled, theta.reshape(chains, draws, -1))


def non_private_posterior(
    model: pm.Model, *, random_seed: int | None = None, progressbar: bool = True, **settings: Any
) -> xr.DataTree:
    """PyMC's NUTS posterior of ``model``: NOT differentially private.

    Only the ``posterior`` group is kept (``pm.sample`` also returns the data), labelled in its
    attributes as not private.  The demo may show it because its data are public.
    """
    import pymc as pm
    import xarray as xr

    idata = pm.sample(
        model=model,
        random_seed=random_seed,
        progressbar=progressbar,
        compute_convergence_checks=False,
        **settings,
    )
    posterior = idata["posterior"].to_dataset()
    posterior.attrs = {"privacy_note": "NOT PRIVATE: PyMC NUTS on the data themselves"}
    return xr.DataTree.from_dict({"posterior": posterior})


def coverage_of(
    posteriors: dict[str, xr.DataTree], reference: str, *, ci_prob: float | None = None
) -> dict[str, tuple[int, int]]:
    """For every posterior but ``reference``: how many of its parameters' intervals (ArviZ's
    ``stats.ci_prob`` by default) contain the ``reference`` posterior's mean, out of how many."""
    import arviz as az

    centre = az.summary(posteriors[reference], kind="stats", ci_prob=ci_prob)["mean"]
    counts = {}
    for label, tree in posteriors.items():
        if label == reference:
            continue
        stats = az.summary(tree, kind="stats", ci_prob=ci_prob)
        lower, upper = (c for c in stats.columns if c.endswith(("_lb", "_ub")))
        inside = (stats[lower] <= centre) & (centre <= stats[upper])
        counts[label] = (int(inside.sum()), len(inside))
    return counts
