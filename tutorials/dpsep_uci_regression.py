"""DP-SEP on UCI regression with a one-hidden-layer Bayesian network: the DP-SEP paper's
Tables 3 and 4 (Section 6.2), test RMSE and test log-likelihood at ε = 1, δ = 1e-5.

The network is PBP's (which the paper uses): 50 ReLU hidden units, pre-activations scaled by
1/√(inputs + 1), N(0, 1) priors on every weight and bias, and a Gamma(6, 6) prior on the noise
precision; inputs and targets are standardised with the training split's statistics.  Written as
an ordinary PyMC model, it has θ = the (D + 2)·50 + 2 unconstrained parameters (the noise
precision on the log scale), which DP-SEP approximates with a diagonal Gaussian, like PBP.

Methods: SEP (the plugin's engine with the noise and clipping off: not private) and DP-SEP with
``dpppl.sample(mechanism="dp-sep", epsilon=1, delta=1e-5)``, at the paper's C = 1 and γ = 1 and
at C = γ = 0.1 (a less noisy state; see the results file); all with the paper's 40 passes and
the plugin's defaults otherwise.
Predictions average the network over 200 posterior draws; the test log-likelihood is
log (1/S) Σ_s N(y | f_s(x), 1/τ_s) in the original units of the target.

Data: :func:`dpppl.datasets.load_uci_regression` (``--data DIR``, else where dpppl looks for
data: see :mod:`dpppl.datasets`), the layout of the standard Bayesian deep learning benchmark
(Hernández-Lobato & Adams 2015); its ``index_train_<i>.txt`` / ``index_test_<i>.txt`` splits are
used when present, otherwise dpppl's random 90/10 split i.

Privacy caveats: standardisation uses the training split's means and standard deviations, which
a real release would take from public knowledge or spend budget on (the paper does the same);
the clipping bound and schedule were fixed in advance, not tuned on the data.

Usage::

    python tutorials/dpsep_uci_regression.py --smoke     # under a minute: wine, 1 split, 2 passes, m = 8
    python tutorials/dpsep_uci_regression.py --out tutorials/dpsep_uci_regression_results.md
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pymc as pm

import dpppl
from dpppl.datasets import UCIRegressionData, load_uci_regression
from dpppl.progress import Progress
from dpppl_dp_sep import DPSEP, run_sep

DATASETS = ("kin8nm", "power-plant", "wine-quality-red")
EPSILON, DELTA, HIDDEN, PREDICTIVE_DRAWS = 1.0, 1e-5, 50, 200

#: The paper's Tables 3 and 4 (mean ± sd over 10 splits): RMSE and test log-likelihood.
PAPER = {
    "kin8nm": {"SEP": (0.089, 0.0042, 0.999, 0.0479), "DP-SEP": (0.078, 0.0022, 1.125, 0.0212)},
    "power-plant": {"SEP": (4.061, 0.1356, -2.821, 0.0316),
                    "DP-SEP": (4.032, 0.1385, -2.814, 0.0323)},
    "wine-quality-red": {"SEP": (0.623, 0.0436, -0.936, 0.0643),
                         "DP-SEP": (0.627, 0.0362, -0.938, 0.0486)},
    "naval-propulsion-plant": {"SEP": (0.002, 0.0001, 4.609, 0.0531),
                               "DP-SEP": (0.002, 0.0003, 4.686, 0.1053)},
    "protein-tertiary-structure": {"SEP": (4.602, 0.0649, -2.945, 0.0139),
                                   "DP-SEP": (4.585, 0.0589, -2.941, 0.0130)},
}


# -- data ---------------------------------------------------------------------------------------


@dataclass
class Split:
    """One train/test split, standardised with the training statistics."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    y_mean: float
    y_std: float


def load_split(data: UCIRegressionData, index: int) -> Split:
    """Split ``index`` of ``data`` (the benchmark's indices if present, else dpppl's random 90/10
    split), standardised with the training split's statistics."""
    train, test = data.split(index)
    x, y = data.X, data.y
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std[x_std == 0] = 1.0
    y_mean, y_std = float(y[train].mean()), float(y[train].std())
    return Split(
        (x[train] - x_mean) / x_std, (y[train] - y_mean) / y_std,
        (x[test] - x_mean) / x_std, y[test], y_mean, y_std,
    )


# -- model and predictions ----------------------------------------------------------------------


def network(x: np.ndarray, y: np.ndarray, hidden: int = HIDDEN) -> pm.Model:
    """PBP's one-hidden-layer ReLU network as a PyMC model."""
    inputs = x.shape[1]
    coords = {"obs": range(len(y)), "feature": range(inputs), "hidden": range(hidden)}
    with pm.Model(coords=coords) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        w0 = pm.Normal("w0", 0, 1, dims=("feature", "hidden"))
        b0 = pm.Normal("b0", 0, 1, dims="hidden")
        w1 = pm.Normal("w1", 0, 1, dims="hidden")
        b1 = pm.Normal("b1", 0, 1)
        precision = pm.Gamma("noise_precision", 6, 6)
        activation = pm.math.maximum(0, (features @ w0 + b0) / math.sqrt(inputs + 1))
        mean = activation @ w1 / math.sqrt(hidden + 1) + b1
        pm.Normal("y", mean, 1 / pm.math.sqrt(precision), observed=y, dims="obs")
    return model


def forward(draws: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Network outputs (draws, test points) for flattened posterior draws."""
    inputs, hidden = draws["w0"].shape[1:]
    pre = (np.einsum("nd,sdh->snh", x, draws["w0"]) + draws["b0"][:, None, :]) / math.sqrt(
        inputs + 1
    )
    out = np.einsum("snh,sh->sn", np.maximum(pre, 0), draws["w1"]) / math.sqrt(hidden + 1)
    return out + draws["b1"][:, None]


def scores(posterior, split: Split) -> tuple[float, float]:
    """Test RMSE of the predictive mean and test log-likelihood, in the target's units."""
    names = ("w0", "b0", "w1", "b1", "noise_precision")
    flat = {n: np.asarray(posterior[n]) for n in names}
    flat = {n: v.reshape(-1, *v.shape[2:]) for n, v in flat.items()}
    pick = np.linspace(0, flat["b1"].shape[0] - 1, PREDICTIVE_DRAWS).astype(int)
    flat = {n: v[pick] for n, v in flat.items()}
    f = forward(flat, split.x_test) * split.y_std + split.y_mean
    sd = split.y_std / np.sqrt(flat["noise_precision"])[:, None]
    rmse = float(np.sqrt(np.mean((f.mean(0) - split.y_test) ** 2)))
    log_density = -0.5 * ((split.y_test - f) / sd) ** 2 - np.log(sd) - 0.5 * math.log(2 * math.pi)
    lse = np.logaddexp.reduce(log_density, axis=0) - math.log(log_density.shape[0])
    return rmse, float(lse.mean())


# -- experiment ---------------------------------------------------------------------------------


def sep_posterior(model: pm.Model, mechanism: DPSEP, seed: int):
    """Plain SEP (no clipping, no noise; not private) with the mechanism's schedule, as draws
    named like the model's variables."""
    compiled = dpppl.record_model(model)
    settings = dataclasses.replace(
        mechanism.engine_settings(compiled, noise_std=0.0), clipping_bound=math.inf
    )
    result = run_sep(
        compiled, compiled.data(), settings, key=jax.random.key(seed), progress=Progress(False)
    )
    theta = result.family.sample(result.approximation, np.random.default_rng(seed), (1, 1000))
    values = jax.vmap(compiled.constrain)(theta[0])
    return {k: np.asarray(v)[None] for k, v in values.items()}


#: The private runs: the paper's settings, and a less noisy state (see the results file).
DP_RUNS = {
    "DP-SEP": {"clipping_bound": 1.0, "damping": 1.0},
    "DP-SEP C=0.1 γ=0.1": {"clipping_bound": 0.1, "damping": 0.1},
}


def run(args: argparse.Namespace) -> str:
    schedule = dict(passes=args.passes, batch_size=args.batch_size)
    rows = []
    for name in args.datasets:
        methods = ["SEP", *DP_RUNS]
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
        seconds = dict.fromkeys(methods, 0.0)
        sigma = math.nan
        data = load_uci_regression(name, args.data)
        splits = min(args.splits, data.n_splits)
        for index in range(splits):
            split = load_split(data, index)
            model = network(split.x_train, split.y_train)
            start = time.perf_counter()
            sep = sep_posterior(model, DPSEP(**schedule), index)
            results["SEP"].append(scores(sep, split))
            seconds["SEP"] += time.perf_counter() - start
            for method, options in DP_RUNS.items():
                start = time.perf_counter()
                with model:
                    idata = dpppl.sample(
                        mechanism="dp-sep", epsilon=EPSILON, delta=DELTA, random_seed=index,
                        progressbar=False, draws=250, **schedule, **options,
                    )
                seconds[method] += time.perf_counter() - start
                sigma = dpppl.PrivacyMetadata.from_result(idata).noise_multiplier
                results[method].append(scores(idata["posterior"], split))
            print(name, index, {k: v[-1] for k, v in results.items()}, flush=True)
        for method, values in results.items():
            rows.append((name, method, np.array(values), seconds[method] / splits,
                         sigma if method != "SEP" else None, splits))
    return report(args, rows)


def report(args: argparse.Namespace, rows) -> str:
    lines = [
        "| Data set | Method | RMSE | paper RMSE | test LL | paper test LL | splits | "
        "sigma | s per split |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, method, values, seconds, sigma, splits in rows:
        mean, sd = values.mean(0), values.std(0)
        paper = PAPER.get(name, {}).get(method.split(" ")[0])
        paper_rmse = f"{paper[0]} ± {paper[1]}" if paper else "n/a"
        paper_ll = f"{paper[2]} ± {paper[3]}" if paper else "n/a"
        lines.append(
            f"| {name} | {method} | {mean[0]:.4g} ± {sd[0]:.2g} | {paper_rmse} | "
            f"{mean[1]:.4g} ± {sd[1]:.2g} | {paper_ll} | {splits} | "
            f"{'' if sigma is None else f'{sigma:.3g}'} | {seconds:.0f} |"
        )
    header = (
        f"Command: `python tutorials/dpsep_uci_regression.py {' '.join(args.argv)}`; "
        f"{time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, JAX on {jax.default_backend()}.\n\n"
        f"passes = {args.passes}, batch_size = {args.batch_size}, epsilon = {EPSILON}, "
        f"delta = {DELTA}, {HIDDEN} hidden units, diagonal Gaussian.  Cells: mean ± sd over "
        "splits; the paper's are over 10 splits at 40 passes with one record per step."
    )
    return header + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--data", default=None, help="folder holding uci-regression/")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--splits", type=int, default=5, help="at most the data set's n_splits")
    parser.add_argument("--passes", type=float, default=40.0)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.smoke:
        args.datasets, args.splits, args.passes, args.batch_size = ["wine-quality-red"], 1, 2.0, 8
    start = time.perf_counter()
    table = run(args)
    table += f"\nTotal wall time: {time.perf_counter() - start:.0f} s\n"
    print(table)
    if args.out is not None:
        args.out.write_text(table)


if __name__ == "__main__":
    sys.exit(main())
