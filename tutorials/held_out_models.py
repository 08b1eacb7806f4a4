"""Is NA-DPVI calibrated on models it was not tuned on?  TARP studies of held-out models.

Each model below was written to check NA-DPVI's defaults, not to choose them: none is in the test
suite and none shaped a default.  The studies in ``tutorials/RESULTS.md`` (stops 62 and 63) ran
them.  Every model takes public covariates X (drawn afresh for each simulated data set) and the
records' outcomes y; its priors generate the truths that TARP checks.

* Two covariates (correlation 0.5), N = 1000: ``student_t``, ``negbin``, ``gamma``, ``probit``,
  ``beta``, ``hetero`` (normal with a log-linear scale), ``softmax`` (three classes),
  ``ordinal`` (ordered logistic, three cutpoints).
* More observation families on the same two covariates (stop 78): ``student_nu`` (Student-t
  with unknown degrees of freedom, heavy-tailed a priori), ``zero_inflated`` (zero-inflated
  Poisson), ``weibull`` (Weibull regression with unknown shape), ``censored`` (normal regression
  censored above at a public threshold, ``pm.Censored``), ``binomial`` (binomial counts out of a
  public number of trials per record, a third column of X), ``lognormal``.
* Between 13 and 30 parameters, where NA-DPVI releases the records' full curvature and reads it
  with the likelihood model (stop 71): ``mid_logistic`` (20 covariates with Toeplitz correlation
  0.5^|i-j|, N = 5000), ``mid_poisson`` (24 covariates, Toeplitz 0.3^|i-j|, N = 3000),
  ``groups`` (a normal regression with varying intercepts over 20 public groups of unequal
  size, written centred, and a common slope; N = 2000, 24 parameters).
* Past 30 parameters, where NA-DPVI reads a diagonal curvature: ``wide_logistic`` (35
  covariates, N = 2000), ``wide_poisson`` (32 covariates with Toeplitz correlation 0.3^|i-j|,
  N = 3000), ``wide_regression`` (normal with unknown scale, 40 covariates, N = 2000),
  ``far_logistic`` (32 standard normal covariates, N = 8000, so that the weights' prior puts
  them about 12 exact posterior sds from the trace's start where ``wide_logistic``'s are 5;
  stop 80), ``probit_wide`` (34 covariates with Toeplitz correlation 0.3^|i-j|, N = 3000;
  written after stop 81's burn-in gate was chosen, to check it).

A TARP study (K simulated data sets, one private fit each)::

    python tutorials/held_out_models.py wide_logistic --simulations 100 --seed 20261203
    python tutorials/held_out_models.py wide_regression --simulations 100 --option anchored=0.5

``--trace SEED`` instead fits one simulated data set privately and with PyMC's NUTS (no privacy)
and prints how far the DP-SGD trace is from the exact posterior mean, in its standard
deviations, along the trace: the check behind the burn-in diagnosis of stop 63::

    python tutorials/held_out_models.py wide_regression --trace 302

``--against-truth COUNT`` fits COUNT data sets drawn from the prior (seeds ``--seed`` onwards), one
private fit each, and prints per variable how the posterior stands to the truth that drew the
data: the z-scores' sd and mean, the slope of the posterior mean regressed on the truth (1 when
unbiased, below 1 when pulled towards the prior's centre), and how often the central 50 % and 90 %
intervals held it.  The check behind stop 68's intercept diagnosis::

    python tutorials/held_out_models.py wide_logistic --against-truth 30 --seed 1000 --option curvature=full
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from linear_regression import parse_option

import dpppl

DELTA = 1e-5
#: What a study runs with besides NA-DPVI's defaults (the stop 62 and 63 rows).
STUDY_OPTIONS = {"steps": 10_000, "tune": 300, "draws": 500, "chains": 1}
SMOKE_OPTIONS = {"steps": 300, "tune": 100, "draws": 100, "chains": 1}
#: Steps of the trace at which ``--trace`` reports the displacement.
TRACE_STEPS = (0, 250, 500, 1000, 2000, 4000, 10_000)
CORRELATION = np.array([[1.0, 0.5], [0.5, 1.0]])
#: Public groups of the ``groups`` model.
GROUPS = 20


@dataclass(frozen=True)
class HeldOutModel:
    """A model builder, the covariates it is fitted on and the dtype of its outcomes."""

    build: Callable[[np.ndarray, np.ndarray], pm.Model]
    covariates: Callable[[np.random.Generator], np.ndarray]
    n_records: int
    discrete: bool

    def placeholder(self, rng: np.random.Generator) -> pm.Model:
        """The model on drawn covariates and zero outcomes, which a study replaces."""
        return self.placeholder_for(self.covariates(rng))

    def placeholder_for(self, X: np.ndarray) -> pm.Model:
        """The model on covariates ``X`` and zero outcomes."""
        return self.build(X, np.zeros(self.n_records, dtype=int if self.discrete else float))


def correlated_pair(rng: np.random.Generator) -> np.ndarray:
    return rng.multivariate_normal(np.zeros(2), CORRELATION, 1000)


def wide_logistic_covariates(rng: np.random.Generator) -> np.ndarray:
    return 0.5 * rng.standard_normal((2000, 35))


def far_logistic_covariates(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((8000, 32))


def toeplitz_covariates(rng: np.random.Generator) -> np.ndarray:
    return toeplitz(rng, 3000, 32, 0.3)


def regression_covariates(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((2000, 40))


def toeplitz(rng: np.random.Generator, n: int, size: int, correlation: float) -> np.ndarray:
    """``n`` records of ``size`` covariates with sd 0.5 and correlation ``correlation``^|i-j|."""
    lags = np.abs(np.subtract.outer(np.arange(size), np.arange(size)))
    return 0.5 * rng.multivariate_normal(np.zeros(size), correlation**lags, n)


def probit_wide_covariates(rng: np.random.Generator) -> np.ndarray:
    return toeplitz(rng, 3000, 34, 0.3)


def mid_logistic_covariates(rng: np.random.Generator) -> np.ndarray:
    return toeplitz(rng, 5000, 20, 0.5)


def mid_poisson_covariates(rng: np.random.Generator) -> np.ndarray:
    return toeplitz(rng, 3000, 24, 0.3)


def grouped_covariates(rng: np.random.Generator) -> np.ndarray:
    """A covariate and a public group label (column 1, 20 groups of unequal size)."""
    groups = rng.choice(GROUPS, size=2000, p=np.arange(1, GROUPS + 1) / (GROUPS * (GROUPS + 1) / 2))
    return np.stack([rng.standard_normal(2000), groups], axis=1)


def _model(X: np.ndarray) -> tuple[pm.Model, pt.TensorVariable]:
    model = pm.Model(coords={"feature": range(X.shape[1])})
    with model:
        x = pm.Data("X", X)
    return model, x


def linear_predictor(
    x: pt.TensorVariable, w_sd: float, b0_mean: float = 0.0, b0_sd: float = 1.0
) -> pt.TensorVariable:
    """b0 + x w with b0 ~ N(b0_mean, b0_sd²) and w ~ N(0, w_sd²), inside a model context."""
    b0 = pm.Normal("b0", b0_mean, b0_sd)
    w = pm.Normal("w", 0, w_sd, dims="feature")
    return b0 + x @ w


def student_t(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 1)
        s = pm.Exponential("s", 1)
        pm.StudentT("y", nu=4, mu=eta, sigma=s, observed=y)
    return model


def negbin(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5, 1, 0.5)
        alpha = pm.Gamma("alpha", 2, 0.5)
        pm.NegativeBinomial("y", mu=pm.math.exp(eta), alpha=alpha, observed=y)
    return model


def gamma(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        shape = pm.Gamma("shape", 4, 1)
        mu = pm.math.exp(eta)
        pm.Gamma("y", alpha=shape, beta=shape / mu, observed=y)
    return model


def probit_regression(X: np.ndarray, y: np.ndarray, w_sd: float) -> pm.Model:
    """A probit regression on every column of X, weights ~ N(0, w_sd²)."""
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, w_sd)
        pm.Bernoulli("y", p=pm.math.invprobit(eta), observed=y)
    return model


def probit(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return probit_regression(X, y, 0.5)


def beta(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        phi = pm.Gamma("phi", 4, 0.2)
        mu = pm.math.invlogit(eta)
        pm.Beta("y", alpha=mu * phi, beta=(1 - mu) * phi, observed=y)
    return model


def hetero(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 1)
        c0 = pm.Normal("c0", 0, 0.5)
        c1 = pm.Normal("c1", 0, 0.5)
        pm.Normal("y", eta, pm.math.exp(c0 + c1 * x[:, 0]), observed=y)
    return model


def softmax(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        model.add_coord("cls", range(2))
        b = pm.Normal("b", 0, 1, dims="cls")
        W = pm.Normal("W", 0, 0.5, dims=("feature", "cls"))
        # The first class's logit is 0; built from the data so that it follows the records.
        eta = pt.concatenate([pt.zeros_like(x[:, :1]), b + x @ W], axis=1)
        pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=y)
    return model


def ordinal(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        w = pm.Normal("w", 0, 0.5, dims="feature")
        # Cutpoints built increasing, so that prior draws (TARP's truths) are ordered too.
        c0 = pm.Normal("c0", -1, 1)
        gap = pm.Gamma("gap", 4, 4, shape=2)
        cutpoints = pt.concatenate([c0[None], c0 + pt.cumsum(gap)])
        pm.OrderedLogistic("y", eta=x @ w, cutpoints=cutpoints, observed=y)
    return model


def student_nu(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """A robust regression whose tails are learned: ν ~ Gamma(8, 2), mean 4."""
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 1)
        s = pm.Exponential("s", 1)
        nu = pm.Gamma("nu", 8, 2)
        pm.StudentT("y", nu=nu, mu=eta, sigma=s, observed=y)
    return model


def zero_inflated(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5, 1, 0.5)
        psi = pm.Beta("psi", 4, 2)  # the share of records drawn from the Poisson
        pm.ZeroInflatedPoisson("y", psi=psi, mu=pm.math.exp(eta), observed=y)
    return model


def weibull(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        shape = pm.Gamma("shape", 6, 4)
        pm.Weibull("y", alpha=shape, beta=pm.math.exp(eta), observed=y)
    return model


#: The public threshold above which ``censored`` records read only "at least this much".
CENSORED_AT = 1.5


def censored(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        s = pm.HalfNormal("s", 1)
        pm.Censored("y", pm.Normal.dist(eta, s), lower=None, upper=CENSORED_AT, observed=y)
    return model


def binomial_covariates(rng: np.random.Generator) -> np.ndarray:
    """The correlated pair and each record's public number of trials, 1 to 20."""
    pair = correlated_pair(rng)
    return np.column_stack([pair, rng.integers(1, 21, len(pair))])


def binomial(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model = pm.Model(coords={"feature": range(2)})
    with model:
        data = pm.Data("X", X)
        trials = pt.cast(data[:, 2], "int64")
        eta = linear_predictor(data[:, :2], 0.5)
        pm.Binomial("y", n=trials, logit_p=eta, observed=y)
    return model


def lognormal(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        s = pm.HalfNormal("s", 1)
        pm.LogNormal("y", mu=eta, sigma=s, observed=y)
    return model


def logistic(X: np.ndarray, y: np.ndarray, w_sd: float) -> pm.Model:
    """A logistic regression on every column of X, weights ~ N(0, w_sd²)."""
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, w_sd)
        pm.Bernoulli("y", logit_p=eta, observed=y)
    return model


def wide_logistic(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return logistic(X, y, 0.5)


def far_logistic(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return logistic(X, y, 0.3)


def wide_poisson(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.2, 1, 0.5)
        pm.Poisson("y", mu=pm.math.exp(eta), observed=y)
    return model


def wide_regression(X: np.ndarray, y: np.ndarray) -> pm.Model:
    model, x = _model(X)
    with model:
        eta = linear_predictor(x, 0.5)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", eta, s, observed=y)
    return model


def probit_wide(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return probit_regression(X, y, 0.3)


def mid_logistic(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return wide_logistic(X, y)


def mid_poisson(X: np.ndarray, y: np.ndarray) -> pm.Model:
    return wide_poisson(X, y)


def groups(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """Varying intercepts over 20 public groups, written centred, and a common slope."""
    model = pm.Model(coords={"group": range(GROUPS)})
    with model:
        data = pm.Data("X", X)
        x, group = data[:, 0], pt.cast(data[:, 1], "int64")
        mu_a = pm.Normal("mu_a", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        a = pm.Normal("a", mu_a, tau, dims="group")
        b = pm.Normal("b", 0, 1)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a[group] + b * x, s, observed=y)
    return model


MODELS = {
    "student_t": HeldOutModel(student_t, correlated_pair, 1000, discrete=False),
    "negbin": HeldOutModel(negbin, correlated_pair, 1000, discrete=True),
    "gamma": HeldOutModel(gamma, correlated_pair, 1000, discrete=False),
    "probit": HeldOutModel(probit, correlated_pair, 1000, discrete=True),
    "beta": HeldOutModel(beta, correlated_pair, 1000, discrete=False),
    "hetero": HeldOutModel(hetero, correlated_pair, 1000, discrete=False),
    "softmax": HeldOutModel(softmax, correlated_pair, 1000, discrete=True),
    "ordinal": HeldOutModel(ordinal, correlated_pair, 1000, discrete=True),
    "student_nu": HeldOutModel(student_nu, correlated_pair, 1000, discrete=False),
    "zero_inflated": HeldOutModel(zero_inflated, correlated_pair, 1000, discrete=True),
    "weibull": HeldOutModel(weibull, correlated_pair, 1000, discrete=False),
    "censored": HeldOutModel(censored, correlated_pair, 1000, discrete=False),
    "binomial": HeldOutModel(binomial, binomial_covariates, 1000, discrete=True),
    "lognormal": HeldOutModel(lognormal, correlated_pair, 1000, discrete=False),
    "wide_logistic": HeldOutModel(wide_logistic, wide_logistic_covariates, 2000, discrete=True),
    "wide_poisson": HeldOutModel(wide_poisson, toeplitz_covariates, 3000, discrete=True),
    "wide_regression": HeldOutModel(wide_regression, regression_covariates, 2000, discrete=False),
    "far_logistic": HeldOutModel(far_logistic, far_logistic_covariates, 8000, discrete=True),
    "probit_wide": HeldOutModel(probit_wide, probit_wide_covariates, 3000, discrete=True),
    "mid_logistic": HeldOutModel(mid_logistic, mid_logistic_covariates, 5000, discrete=True),
    "mid_poisson": HeldOutModel(mid_poisson, mid_poisson_covariates, 3000, discrete=True),
    "groups": HeldOutModel(groups, grouped_covariates, 2000, discrete=False),
}


def tarp_study(name: str, args: argparse.Namespace, options: dict) -> dict:
    """One TARP study of model ``name``: its summary row (and the study saved under --out)."""
    held_out = MODELS[name]
    return run_study(
        name,
        held_out.placeholder(np.random.default_rng(0)),
        lambda rng: {"X": held_out.covariates(rng)},
        args,
        options,
    )


def run_study(
    name: str, model: pm.Model, covariates, args: argparse.Namespace, options: dict
) -> dict:
    """A TARP study of ``model`` at NA-DPVI's study settings and its summary row: joint and
    marginal RMSE, the fits' warnings and the wall time; the study itself is saved as netcdf
    under ``args.out`` when given."""
    start = time.perf_counter()
    study = dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=args.epsilon,
        delta=DELTA,
        n_simulations=2 if args.smoke else args.simulations,
        covariates=covariates,
        n_workers=args.workers,
        random_seed=args.seed,
        progressbar=not args.smoke,
        **{**(SMOKE_OPTIONS if args.smoke else STUDY_OPTIONS), **options},
    )
    marginal = study["marginal_rmse"].mean("repeat")
    fit_warnings = [str(w) for w in study["fit_warnings"].values]
    row = {
        "model": name,
        "K": int(study.attrs["n_simulations"]),
        "epsilon": args.epsilon,
        "options": options,
        "rmse": round(float(study["rmse"].mean()), 4),
        "rmse_std": round(float(study["rmse"].std()), 4),
        "marginal_rmse": {
            str(p): round(float(v), 3) for p, v in zip(marginal["parameter"].values, marginal)
        },
        "fits_with_warnings": sum(bool(w) for w in fit_warnings),
        "drift_warnings": sum("not settled" in w for w in fit_warnings),
        "divergence_warnings": sum("divergent" in w for w in fit_warnings),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        study.to_netcdf(args.out / f"{name}_{row['K']}_{args.epsilon}_{args.seed}.nc")
    return row


def simulated_data(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Covariates and outcomes of one data set drawn from the model's prior."""
    X, y, _ = drawn_truth(name, seed)
    return X, y


def drawn_truth(name: str, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Covariates, outcomes and the parameters that drew them (by variable, as the model's
    prior draws them) of one simulated data set."""
    held_out = MODELS[name]
    rng = np.random.default_rng(seed)
    X = held_out.covariates(rng)
    model = held_out.placeholder_for(X)
    *values, y = pm.draw([*model.free_RVs, model["y"]], random_seed=rng)
    return X, y, {rv.name: np.asarray(v) for rv, v in zip(model.free_RVs, values, strict=True)}


def unconstrained(
    model: pm.Model, values: dict[str, np.ndarray], leading: int
) -> dict[str, np.ndarray]:
    """``values`` of the model's free variables (each with ``leading`` axes of draws in front) in
    the unconstrained coordinates DP-SGD's μ lives in, each flattened to (draws, size), by value
    variable in the model's order."""
    blocks = {}
    for rv, value_var in zip(model.free_RVs, model.value_vars, strict=True):
        value = np.asarray(values[rv.name], dtype=float)
        transform = model.rvs_to_transforms.get(rv)
        if transform is not None:
            value = transform.forward(pt.as_tensor(value), *rv.owner.inputs).eval()
        blocks[value_var.name] = np.reshape(value, (int(np.prod(value.shape[:leading])), -1))
    return blocks


def private_fit(model: pm.Model, seed: int, args: argparse.Namespace, options: dict):
    """One NA-DPVI fit of ``model`` at the study's settings (smoke size with ``--smoke``)."""
    with model:
        return dpppl.sample(
            mechanism="na-dpvi",
            epsilon=args.epsilon,
            delta=DELTA,
            random_seed=seed,
            progressbar=False,
            **{**(SMOKE_OPTIONS if args.smoke else STUDY_OPTIONS), **options},
        )


def against_truth(name: str, count: int, args: argparse.Namespace, options: dict) -> dict:
    """``count`` private fits of data sets drawn from the prior, each set beside the truth that
    drew it: per variable, the z-scores' sd and mean, the posterior mean's slope on the truth
    and the central intervals' coverage."""
    truths, means, sds, inside = [], [], [], []
    for seed in range(args.seed, args.seed + count):
        X, y, truth = drawn_truth(name, seed)
        model = MODELS[name].build(X, y)
        idata = private_fit(model, seed, args, options)
        posterior = {rv.name: idata.posterior[rv.name].values for rv in model.free_RVs}
        blocks = unconstrained(model, posterior, leading=2)
        draws = np.concatenate(list(blocks.values()), axis=1)
        theta = np.concatenate(list(unconstrained(model, truth, leading=0).values()), axis=1)[0]
        truths.append(theta)
        means.append(draws.mean(axis=0))
        sds.append(draws.std(axis=0))
        inside.append(
            [np.abs(np.mean(draws < theta, axis=0) - 0.5) < level / 2 for level in (0.5, 0.9)]
        )
    truths, means, sds, inside = map(np.array, (truths, means, sds, inside))
    z = (means - truths) / sds
    # Each value variable's columns, sized in the unconstrained coordinates (a simplex has one
    # fewer there).
    sizes = [block.shape[1] for block in blocks.values()]
    columns = np.split(np.arange(truths.shape[1]), np.cumsum(sizes)[:-1])
    return {
        "model": name,
        "data_sets": count,
        "epsilon": args.epsilon,
        "options": options,
        "variables": {
            variable: {
                "z_sd": round(float(z[:, c].std()), 2),
                "z_mean": round(float(z[:, c].mean()), 2),
                "slope_on_truth": round(
                    float(np.polyfit(truths[:, c].ravel(), means[:, c].ravel(), 1)[0]), 2
                ),
                "held_50": round(float(inside[:, 0, c].mean()), 2),
                "held_90": round(float(inside[:, 1, c].mean()), 2),
            }
            for variable, c in zip(blocks, columns, strict=True)
        },
    }


def unconstrained_draws(idata, model: pm.Model) -> tuple[np.ndarray, list[str]]:
    """Exact draws (draws × n) in the unconstrained coordinates that DP-SGD's μ lives in, in the
    order of the model's value variables, and their labels as NA-DPVI writes them."""
    columns, labels = [], []
    for value in model.value_vars:
        draws = idata.posterior[value.name]
        columns.append(draws.values.reshape(draws.shape[0] * draws.shape[1], -1))
        cells = itertools.product(*(draws[d].values for d in draws.dims[2:]))
        labels += [value.name + (f"[{','.join(map(str, c))}]" if c else "") for c in cells]
    return np.concatenate(columns, axis=1), labels


def trace_displacement(name: str, seed: int, args: argparse.Namespace, options: dict) -> dict:
    """One private fit beside exact NUTS: the trace's distance from the exact posterior mean."""
    X, y = simulated_data(name, seed)
    build = MODELS[name].build
    model = build(X, y)
    with model:
        exact = pm.sample(
            100 if args.smoke else 1000,
            tune=100 if args.smoke else 500,
            chains=1,
            progressbar=False,
            random_seed=seed,
            compute_convergence_checks=False,
            idata_kwargs={"include_transformed": True},
        )
    reference, names = unconstrained_draws(exact, model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = private_fit(build(X, y), seed, args, options)
    n = reference.shape[1]
    labels = [str(v) for v in idata["dpvi_trace"]["vi_param"].values[:n]]
    if labels != [f"mu[{label}]" for label in names]:
        raise RuntimeError(f"the trace's coordinates {labels} are not the model's {names}")
    mu = idata["dpvi_trace"]["phi"].values[:, :n]
    z = (mu - reference.mean(0)) / reference.std(0)
    return {
        "model": name,
        "seed": seed,
        "epsilon": args.epsilon,
        "options": options,
        "displacement": {
            step: {
                "rms": round(float(np.sqrt(np.mean(z[step] ** 2))), 1),
                "largest": labels[int(np.argmax(np.abs(z[step])))],
                "largest_z": round(float(z[step][np.argmax(np.abs(z[step]))]), 1),
            }
            for step in TRACE_STEPS
            if step < len(z)
        },
        # The fit's own warnings (dpppl.sample's), not those of the libraries below it.
        "warnings": [str(w.message)[:160] for w in caught if w.category is UserWarning],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--simulations", type=int, default=100, help="K simulated data sets")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=20261203)
    parser.add_argument("--workers", type=int, default=2, help="processes for the study")
    parser.add_argument("--out", type=Path, default=None, help="folder for the study's netcdf")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an NA-DPVI option, e.g. anchored=0.5 (repeatable)",
    )
    parser.add_argument(
        "--trace",
        type=int,
        default=None,
        metavar="SEED",
        help="one data set beside exact NUTS instead of a study",
    )
    parser.add_argument(
        "--against-truth",
        type=int,
        default=None,
        metavar="COUNT",
        help="COUNT data sets, each fit beside the truth that drew it, instead of a study",
    )
    parser.add_argument("--smoke", action="store_true", help="K = 2 (or NUTS 100 draws), 300 steps")
    args = parser.parse_args()
    options = dict(parse_option(o) for o in args.option)
    if args.against_truth is not None:
        print(json.dumps(against_truth(args.model, args.against_truth, args, options)))
    elif args.trace is not None:
        print(json.dumps(trace_displacement(args.model, args.trace, args, options)))
    else:
        print(json.dumps(tarp_study(args.model, args, options)))


if __name__ == "__main__":
    main()
