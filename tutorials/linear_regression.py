"""NA-DPVI on 10-D Bayesian linear regression: TARP coverage at ε ∈ {0.1, 0.3, 1} (paper, Table 2).

Reproduces Section 4.3 of Ahmed, Jälkö, Honkela et al., "Noise-aware differentially private
variational inference" (AISTATS 2025) with dpppl.  The model (paper eq. 28):

    σ² ~ InverseGamma(20, 1/2),   w_j | σ² ~ N(0, 4σ²)  (j = 1..10, and the bias b),
    x_ij ~ N(0, 1),               y_i | x_i, w, b, σ² ~ N(w·x_i + b, σ²),

so θ = (w_1..w_10, b, σ²) has 12 coordinates.  N = 5000, δ = 1e-5, NA-DPVI at its defaults
(T = 10⁴, κ = 0.1) with NUTS or Laplace post-processing, and the naive last iterate.

Part 1 fits the model once to a simulated data set, as a user would, and shows the private
posterior next to the parameters that generated the data.  Part 2 runs the paper's TARP studies:
K simulated data sets (θ from the prior, covariates x ~ N(0, 1) simulated afresh for each: public,
synthetic covariates, so the study computes on no private data), a private fit on each, and the RMSE of
the joint coverage error (eq. 27), mean ± std over 20 reference draws.  The paper reports it ×10³.

    python tutorials/linear_regression.py --smoke                      # CI size: ε = 1, K = 4
    python tutorials/linear_regression.py                              # K = 500: hours on 2 cores
    python tutorials/linear_regression.py --simulations 100 --inference nuts --epsilon 0.1 0.3 1

Each study is saved as it finishes (``<out>/eps<ε>_<method>_K<K>.nc`` and ``.png``) and its summary
merged into ``<out>/results.json``; ``--report`` prints the table from what is saved.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt

import dpppl

N_RECORDS = 5000
N_FEATURES = 10
DELTA = 1e-5
EPSILONS = (0.1, 0.3, 1.0)

#: Paper, Table 2: joint TARP RMSE × 10³, mean ± std over 20 reference repeats, K = 500.
PAPER = {
    "nuts": {0.1: (36, 11), 0.3: (35, 11), 1.0: (27, 9)},
    "laplace": {0.1: (78, 11), 0.3: (98, 6), 1.0: (60, 7)},
    "naive": {0.1: (512, 3), 0.3: (307, 3), 1.0: (360, 3)},
}
METHODS = ("nuts", "laplace", "naive")

#: NA-DPVI options of --smoke: every code path in seconds, far too few steps for a real posterior.
SMOKE_OPTIONS = {"steps": 300, "tune": 200, "draws": 200, "chains": 1}
#: The paper's post-processing for its studies: one NUTS chain of 4000 draws after 1000 warm-up
#: steps.  dpppl's default of two chains (for R-hat) doubles the sampling, which dominates a study's
#: time (3.7 against 5.9 s per replicate at ε = 1), for no change in the coverage the study measures.
#: The single fit of part 1 keeps two chains, as a user would.
STUDY_OPTIONS = {"chains": 1}


def linear_regression(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """The paper's model (eq. 28), written as a PyMC user would."""
    coords = {"obs": np.arange(len(y)), "feature": [f"x{j + 1}" for j in range(X.shape[1])]}
    with pm.Model(coords=coords) as model:
        x = pm.Data("X", X, dims=("obs", "feature"))
        sigma2 = pm.InverseGamma("sigma2", alpha=20.0, beta=0.5)
        prior_sd = 2.0 * pt.sqrt(sigma2)  # N-Γ⁻¹(0, 1/4, 20, 1/2): w | σ² ~ N(0, σ²/(1/4))
        w = pm.Normal("w", 0.0, prior_sd, dims="feature")
        b = pm.Normal("b", 0.0, prior_sd)
        pm.Normal("y", mu=x @ w + b, sigma=pt.sqrt(sigma2), observed=y, dims="obs")
    return model


def simulate_covariates(rng: np.random.Generator, n: int = N_RECORDS) -> dict[str, np.ndarray]:
    """Synthetic covariates x ~ N(0, 1) for the TARP studies (module level, so it pickles)."""
    return {"X": rng.standard_normal((n, N_FEATURES))}


class Covariates:
    """``rng -> {"X": ...}`` for N records: a picklable callable for the worker processes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return simulate_covariates(rng, self.n)


def simulated_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One data set from the model: covariates, outcomes and the parameters that made them."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, N_FEATURES))
    sigma2 = 1.0 / rng.gamma(20.0, 1.0 / 0.5)
    w = rng.normal(0.0, 2.0 * np.sqrt(sigma2), N_FEATURES)
    b = rng.normal(0.0, 2.0 * np.sqrt(sigma2))
    y = X @ w + b + rng.normal(0.0, np.sqrt(sigma2), n)
    return X, y, {"w": w, "b": np.array(b), "sigma2": np.array(sigma2)}


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` from the command line: the value as a Python literal, else as a string."""
    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def na_dpvi_options(method: str, smoke: bool, extra: Mapping[str, object] | None = None) -> dict:
    options = {**(SMOKE_OPTIONS if smoke else {}), **(extra or {})}
    if method == "naive":
        options["posterior"] = "naive"
    else:
        options["inference"] = method
    return options


def single_fit(args: argparse.Namespace) -> None:
    """Part 1: one private fit, read like any ArviZ result."""
    X, y, truth = simulated_data(args.records, seed=args.seed)
    model = linear_regression(X, y)
    start = time.perf_counter()
    with model:
        idata = dpppl.sample(
            mechanism="na-dpvi", epsilon=1.0, delta=DELTA, random_seed=args.seed,
            progressbar=False, **na_dpvi_options("nuts", args.smoke),
        )
    seconds = time.perf_counter() - start
    print(f"Part 1: one private fit at ε = 1 on N = {args.records} simulated records "
          f"({seconds:.0f} s)")
    print(dpppl.privacy_statement(idata))
    summary = az.summary(idata, var_names=["w", "b", "sigma2"], kind="stats")
    summary["truth"] = np.concatenate([truth["w"], [truth["b"]], [truth["sigma2"]]])
    print(summary.round(3).to_string())


def run_study(epsilon: float, method: str, args: argparse.Namespace):
    X, y, _ = simulated_data(args.records, seed=args.seed)
    model = linear_regression(X, y)  # the data only give shapes: every study data set is simulated
    start = time.perf_counter()
    study = dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=epsilon,
        delta=DELTA,
        covariates=Covariates(args.records),
        n_simulations=args.simulations,
        n_workers=args.workers,
        random_seed=args.seed,
        progressbar=not args.smoke,
        **na_dpvi_options(method, args.smoke, args.study_options),
    )
    return study, time.perf_counter() - start


def record(out: Path, epsilon: float, method: str, study, seconds: float, args) -> dict:
    rmse = study["rmse"] * 1e3
    row = {
        "epsilon": epsilon,
        "method": method,
        "K": int(study.attrs["n_simulations"]),
        "N": int(study.attrs["n_records"]),
        "rmse_x1000_mean": round(float(rmse.mean()), 1),
        "rmse_x1000_std": round(float(rmse.std()), 1),
        # The joint balls' distances are dominated by the coordinate with the widest posterior
        # (log σ² here), so a miscalibrated weight can hide behind a joint RMSE on the floor.
        "marginal_rmse_x1000": {
            str(name): round(float(value) * 1e3, 1)
            for name, value in study["marginal_rmse"].mean("repeat").to_series().items()
        },
        "paper_x1000": PAPER[method][epsilon] if epsilon in PAPER[method] else None,
        "wall_s": round(seconds, 1),
        "workers": args.workers,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.system()}",
        "command": "python " + " ".join(sys.argv),
        "fits_with_warnings": int(study.attrs.get("fits_with_warnings", 0)),
        # The criterion for the post-processing sampler: under 1 % of the fits.
        "fits_with_divergences": sum(
            "divergent transitions" in messages for messages in study["fit_warnings"].values
        ),
        "options": args.study_options,
    }
    path = out / "results.json"
    rows = json.loads(path.read_text()) if path.exists() else {}
    rows[f"eps{epsilon:g}/{method}/K{row['K']}"] = row
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    return row


def print_table(rows: list[dict]) -> None:
    print(f"\nJoint TARP RMSE × 10³, δ = {DELTA:g} (mean ± std over 20 reference repeats), and "
          "the largest marginal one")
    print(f"{'method':<9} {'ε':>5} {'K':>4} {'N':>5} {'dpppl':>11} {'paper (K=500)':>14} "
          f"{'wall':>9}  worst marginal")
    for row in rows:
        paper = row["paper_x1000"]
        paper_text = f"{paper[0]} ± {paper[1]}" if paper else "-"
        print(f"{row['method']:<9} {row['epsilon']:>5g} {row['K']:>4} {row['N']:>5} "
              f"{row['rmse_x1000_mean']:>5.0f} ± {row['rmse_x1000_std']:<3.0f} {paper_text:>14} "
              f"{row['wall_s'] / 60:>5.1f} min  {worst_marginal(row)}")


def worst_marginal(row: dict) -> str:
    """The largest marginal TARP RMSE × 10³ of a saved row and its parameter ('-' for rows saved
    before marginals were recorded)."""
    marginals = row.get("marginal_rmse_x1000")
    if not marginals:
        return "-"
    name = max(marginals, key=marginals.get)
    return f"{marginals[name]:.0f} ({name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CI size: K = 4, N = 500, 300 DP-SGD steps, one process")
    parser.add_argument("--simulations", type=int, default=None, help="K (default 500)")
    parser.add_argument("--records", type=int, default=None, help="N (default 5000)")
    parser.add_argument("--epsilon", type=float, nargs="+", default=None,
                        help="default 0.1 0.3 1 (1 only with --smoke)")
    parser.add_argument("--inference", "--methods", dest="methods", nargs="+", choices=METHODS,
                        default=list(METHODS))
    parser.add_argument("--workers", type=int, default=None, help="processes (default 2)")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--skip-fit", action="store_true", help="skip part 1 (the single fit)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default tutorials/linear_regression; a temporary "
                        "folder with --smoke)")
    parser.add_argument("--report", action="store_true", help="print the saved table and stop")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an NA-DPVI option for the studies, e.g. anchored=0.5 (repeatable)")
    args = parser.parse_args()
    args.study_options = {**STUDY_OPTIONS, **dict(parse_option(text) for text in args.option)}
    if args.smoke:
        args.simulations = args.simulations or 4
        args.records = args.records or 500
        args.workers = args.workers or 1
        args.epsilon = args.epsilon or [1.0]
        args.out = args.out or Path(tempfile.mkdtemp(prefix="dpppl-linreg-"))
    else:
        args.simulations = args.simulations or 500
        args.records = args.records or N_RECORDS
        args.workers = args.workers or 2
        args.epsilon = args.epsilon or list(EPSILONS)
        args.out = args.out or Path(__file__).resolve().parent / "linear_regression"
    if args.report:
        print_table(list(json.loads((args.out / "results.json").read_text()).values()))
        return
    args.out.mkdir(parents=True, exist_ok=True)

    if not args.skip_fit:
        single_fit(args)

    rows = []
    for method in args.methods:
        for epsilon in args.epsilon:
            study, seconds = run_study(epsilon, method, args)
            path = args.out / f"eps{epsilon:g}_{method}_K{args.simulations}.nc"
            study.to_netcdf(path)
            dpppl.plot_tarp(
                study, path.with_suffix(".png"),
                title=f"10-D linear regression, NA-DPVI {method}: ε = {epsilon:g}, "
                f"N = {args.records}, K = {args.simulations}",
            )
            row = record(args.out, epsilon, method, study, seconds, args)
            rows.append(row)
            print(f"{method} ε = {epsilon:g}: joint RMSE × 10³ {row['rmse_x1000_mean']:.0f} ± "
                  f"{row['rmse_x1000_std']:.0f} ({seconds:.0f} s) -> {path}", flush=True)
    print_table(rows)
    print(f"\nStudies and figures saved in {args.out}")


if __name__ == "__main__":
    main()
