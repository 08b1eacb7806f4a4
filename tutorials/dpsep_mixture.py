"""DP-SEP on a mixture of Gaussians: the DP-SEP paper's Table 1 (Section 6.1).

N = 1000 points in 4-D from J = 4 isotropic Gaussian components (standard deviation 0.5, equal
weights), generated the way the paper's code does (``MoG_code/gmm.py``: component means
MU + randn·|randn|, labels uniform).  The PyMC model knows the weights and the noise and has the
component means unknown, each with its own prior N(m_j, 10 I) (the code draws the m_j from N(0, I)
with seed 0: distinct prior means, which also tell the components apart); the component label is
marginalised (``pm.Mixture``), so θ is the 16 means and the record is one 4-D point.

Methods, as in Table 1: SEP, clipped SEP (C = 20, 10, 1), and DP-SEP at ε = 50, 5, 1 (δ = 1e-5,
C = 1) with ``dpppl.sample(mechanism="dp-sep")``.  SEP and clipped SEP run the plugin's engine
(:func:`dpppl_dp_sep.run_sep`) with the noise off: they are not private.  Every method uses the
paper's γ = 1 and 100 passes, and a full 16×16 covariance.

Metric (the paper's code, ``mog.compute_mse``): components are matched to the ground truth's by
their means, then ``F-norm on mean`` = (1/J) Σ_j ‖m_j − m̂_j‖² and ``F-norm on covariance`` =
(1/J) Σ_j ‖S_j − Ŝ_j‖²_F over the per-component 4×4 posterior covariances; the ground truth is
PyMC's NUTS (4 chains of 1000 draws after 500 tuning steps, chains aligned to the true component
means).  Averages over ``--runs`` independent runs (paper: 5).

Usage::

    python tutorials/dpsep_mixture.py --smoke       # about a minute: N = 200, 10 passes, 1 run
    python tutorials/dpsep_mixture.py --out tutorials/dpsep_mixture_results.md
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pymc as pm
from scipy.optimize import linear_sum_assignment

import dpppl
from dpppl.progress import Progress
from dpppl_dp_sep import DPSEP, run_sep

J, D, NOISE_SD, PRIOR_VAR, DELTA = 4, 4, 0.5, 10.0, 1e-5

#: Table 1 of the paper: (F-norm on mean, F-norm on covariance).
PAPER = {
    "SEP": (0.0020, 0.0004),
    "SEP clipped C=20": (0.0263, 0.0004),
    "SEP clipped C=10": (1.4950, 0.0005),
    "SEP clipped C=1": (2.2065, 0.0459),
    "DP-SEP eps=50": (2.2411, 0.0358),
    "DP-SEP eps=5": (12.1623, 1.0655),
    "DP-SEP eps=1": (82.9746, 5.0777),
}


def simulate(n: int, seed: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Points and true component means, generated like the paper's code (seed 60)."""
    rng = np.random.RandomState(seed * 10)
    centre = rng.randn(J, D)
    spread = np.abs(rng.randn(J, D))
    data_rng = np.random.RandomState(seed)
    means = centre + data_rng.randn(J, D) * spread
    labels = data_rng.choice(J, size=n, p=np.full(J, 1 / J))
    return means[labels] + data_rng.randn(n, D) * NOISE_SD, means


def prior_means() -> np.ndarray:
    """The prior means m_j of the paper's code (N(0, I) draws, seed 0)."""
    return np.random.RandomState(0).randn(J, D)


def mixture_model(points: np.ndarray) -> pm.Model:
    """Component means unknown, label marginalised."""
    coords = {"component": range(J), "dim": range(D), "obs": range(points.shape[0])}
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", points, dims=("obs", "dim"))
        mu = pm.Normal("mu", prior_means(), math.sqrt(PRIOR_VAR), dims=("component", "dim"))
        components = [pm.MvNormal.dist(mu=mu[j], cov=NOISE_SD**2 * np.eye(D)) for j in range(J)]
        pm.Mixture("y", w=np.full(J, 1 / J), comp_dists=components, observed=x, dims=("obs", "dim"))
    return model


def match(reference: np.ndarray, means: np.ndarray) -> np.ndarray:
    """The permutation of ``means``' components closest to ``reference``'s."""
    cost = ((reference[:, None, :] - means[None, :, :]) ** 2).sum(-1)
    return linear_sum_assignment(cost)[1]


def nuts_truth(model: pm.Model, truth: np.ndarray, draws: int, tune: int, seed: int):
    """Per-component posterior means (J, D) and covariances (J, D, D) from NUTS.

    The chains start at the true component means: the posterior has a mode per relabelling and
    further local modes that merge nearby components, and the ground truth is the mode around
    the generating means (as in the paper, whose NUTS run also knew the labels).
    """
    with model:
        idata = pm.sample(
            draws=draws, tune=tune, chains=4, cores=2, random_seed=seed, progressbar=False,
            compute_convergence_checks=False, initvals={"mu": truth},
        )
    samples = idata.posterior["mu"].values  # (chain, draw, J, D)
    aligned = np.stack([c[:, match(truth, c.mean(0)), :] for c in samples])
    flat = aligned.reshape(-1, J, D)
    return flat.mean(0), np.stack([np.cov(flat[:, j], rowvar=False) for j in range(J)])


#: A run whose matched component mean is this far from the truth's sits in another mode: two
#: components sharing one cluster and a cluster left without one (the generating means are
#: about 1–3 apart).
MERGED_DISTANCE = 0.5


def errors(
    mean: np.ndarray, covariance: np.ndarray, truth_mean, truth_cov
) -> tuple[float, float, bool]:
    """The paper code's averaged squared F-norms after matching components, and whether some
    component is more than :data:`MERGED_DISTANCE` from its ground-truth mean."""
    mean = mean.reshape(J, D)
    blocks = np.stack([covariance[j * D : (j + 1) * D, j * D : (j + 1) * D] for j in range(J)])
    order = match(truth_mean, mean)
    distances = ((truth_mean - mean[order]) ** 2).sum(-1)
    err_cov = ((truth_cov - blocks[order]) ** 2).sum() / J
    return float(distances.sum() / J), float(err_cov), bool(distances.max() > MERGED_DISTANCE**2)


#: The two schedules compared: the paper's as its code runs it, and SEP run to convergence.
SCHEDULES = {
    # The paper's code updates the global site by ξ(f_n − f)/N with ξ = γ/N = 1/N, so its
    # damping in this plugin's terms (f moves γ/N of the way per record) is γ = 1/N.  It starts
    # at the prior and reports the last iterate.
    "paper schedule": lambda n: {"damping": 1.0 / n, "average_last": 0.0, "noise_floor": 0.0},
    # The plugin's defaults: γ = 1, the released sites averaged over the second half, the
    # precision floored at the noise level.
    "converged": lambda n: {"damping": 1.0, "average_last": 0.5, "noise_floor": 1.0},
}
BASELINES = {"SEP": math.inf, "SEP clipped C=20": 20.0, "SEP clipped C=10": 10.0,
             "SEP clipped C=1": 1.0}
EPSILONS = (50.0, 5.0, 1.0)


def run(args: argparse.Namespace) -> str:
    points, truth = simulate(args.n)
    model = mixture_model(points)
    start = time.perf_counter()
    truth_mean, truth_cov = nuts_truth(model, truth, args.nuts_draws, args.nuts_tune, seed=1)
    nuts_time = time.perf_counter() - start
    compiled = dpppl.record_model(model)
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    seconds: dict[tuple[str, str], float] = {}
    sigmas: dict[str, float] = {}
    for schedule, changes in SCHEDULES.items():
        options = dict(passes=args.passes, clipping_bound=1.0, covariance="full",
                       init_jitter=0.0, **changes(args.n))
        mechanism = DPSEP(**options)
        for run_index in range(args.runs):
            for label, bound in BASELINES.items():
                settings = dataclasses.replace(
                    mechanism.engine_settings(compiled, noise_std=0.0), clipping_bound=bound
                )
                begin = time.perf_counter()
                result = run_sep(
                    compiled, compiled.data(), settings, key=jax.random.key(100 + run_index),
                    progress=Progress(False),
                )
                seconds[schedule, label] = time.perf_counter() - begin
                rows.setdefault((schedule, label), []).append(
                    errors(*result.family.moments(result.approximation), truth_mean, truth_cov)
                )
            for epsilon in EPSILONS:
                label = f"DP-SEP eps={epsilon:g}"
                begin = time.perf_counter()
                with model:
                    idata = dpppl.sample(
                        mechanism="dp-sep", epsilon=epsilon, delta=DELTA, random_seed=run_index,
                        progressbar=False, **options,
                    )
                seconds[schedule, label] = time.perf_counter() - begin
                approx = idata["dpsep_approximation"]
                rows.setdefault((schedule, label), []).append(
                    errors(approx["mean"].values, approx["covariance"].values, truth_mean,
                           truth_cov)
                )
                sigmas[label] = dpppl.PrivacyMetadata.from_result(idata).noise_multiplier
            print(f"{schedule}: run {run_index + 1} of {args.runs} done", flush=True)
    return report(args, rows, seconds, sigmas, nuts_time)


def _cell(values: list[tuple[float, float, bool]]) -> str:
    errs = np.array([v[:2] for v in values])
    mean, sd = errs.mean(0), errs.std(0)
    merged = sum(v[2] for v in values)
    return (
        f"{mean[0]:.4g} ± {sd[0]:.2g} / {mean[1]:.4g} ± {sd[1]:.2g} ({merged}/{len(values)})"
    )


def report(args, rows, seconds, sigmas, nuts_time) -> str:
    names = list(SCHEDULES)
    lines = [
        "| Method | paper (mean / cov) | " + " | ".join(f"{n} (mean / cov)" for n in names)
        + " | sigma | s per run |",
        "|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for label, paper in PAPER.items():
        cells = [_cell(rows[name, label]) for name in names]
        sigma = sigmas.get(label)
        lines.append(
            f"| {label} | {paper[0]:.4g} / {paper[1]:.4g} | " + " | ".join(cells)
            + f" | {'' if sigma is None else f'{sigma:.3g}'} | "
            + " / ".join(f"{seconds[name, label]:.0f}" for name in names) + " |"
        )
    header = (
        f"Command: `python tutorials/dpsep_mixture.py {' '.join(args.argv)}`; "
        f"{time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, JAX on {jax.default_backend()}.\n\n"
        f"N = {args.n}, passes = {args.passes}, runs = {args.runs}, one record per step, "
        f"C = 1 for DP-SEP, full 16x16 covariance, spherical rule; NUTS {args.nuts_draws} draws "
        f"x 4 chains ({nuts_time:.0f} s).  Cells: mean ± sd over runs of the F-norm on the means "
        f"/ on the covariances, and (k/R) the runs with a component more than "
        f"{MERGED_DISTANCE} from its ground-truth mean (a merged mode)."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, about a minute")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--passes", type=float, default=100.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nuts-draws", type=int, default=1000)
    parser.add_argument("--nuts-tune", type=int, default=500)
    parser.add_argument("--out", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.smoke:
        args.n, args.passes, args.runs, args.nuts_draws, args.nuts_tune = 200, 10.0, 1, 200, 200
    start = time.perf_counter()
    table = run(args)
    table += f"\nTotal wall time: {time.perf_counter() - start:.0f} s\n"
    print(table)
    if args.out is not None:
        args.out.write_text(table)


if __name__ == "__main__":
    sys.exit(main())
