"""NA-DPVI on three exponential families: TARP coverage at ε = 0.1 (NA-DPVI paper, Table 1).

Reproduces Section 4.2 of Ahmed, Jälkö, Honkela et al., "Noise-aware differentially private
variational inference" (AISTATS 2025) with dpppl:

    M1  θ ~ Gamma(8, 2),          x | θ ~ Exponential(θ)
    M2  θ ~ Beta(10, 10),         x | θ ~ Bernoulli(θ)
    M3  θ ~ Dirichlet(5, 5, 5),   x | θ ~ Categorical(θ)

N = 5000 records, ε = 0.1, δ = 1e-5, NA-DPVI at its defaults (T = 10⁴ DP-SGD steps, κ = 0.1, NUTS
post-processing with 1000 warm-up and 2 × 4000 kept draws).  The paper does not print its priors;
these are the ones in the authors' code (DPBayes/noise-aware-dpvi, ``model.py``).

For each model and method a TARP study simulates K data sets (θ_k from the prior, N records given
θ_k), fits each one privately, and asks how often the private posterior's credible balls cover
θ_k.  The summary is the paper's eq. (27): the RMSE of the coverage error C(α) − (1 − α) over the
α grid, mean ± std over 20 draws of the reference points.  Methods:

* ``noise-aware``: NA-DPVI, the paper's method (mixture over the posterior of the optimum φ*);
* ``naive``: the last DP-SGD iterate q(θ; φ_T), which ignores the privacy noise;
* ``bernstein-sheldon``: noisy sufficient statistics with a noise-aware Gibbs sampler (Bernstein
  & Sheldon 2018), if its example plugin is installed (``tutorials/plugin_example/``); otherwise
  the row is skipped, and the script says so.

The studies compute on no private data and spend no privacy budget.  Run from the repository root:

    python tutorials/exponential_families.py --smoke            # CI size: seconds per study
    python tutorials/exponential_families.py                    # paper size: K = 500, 2 processes
    python tutorials/exponential_families.py --models m2 --methods naive --simulations 200

Paper-size studies take minutes to an hour each on two cores (NUTS fits are the slow ones: the
M3 noise-aware study took 50 minutes on one core, about 6 s per fit).  Each study is saved as it
finishes (``<out>/<model>_<method>_K<K>.nc`` and ``.png``) and
its summary is merged into ``<out>/results.json``; ``--report`` prints the table from the saved
studies without fitting anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np
import pymc as pm
import xarray as xr

import dpppl

N_RECORDS = 5000
EPSILON = 0.1
DELTA = 1e-5

#: Paper, Table 1: joint TARP RMSE, mean ± std over 20 reference repeats, K = 500.
PAPER = {
    "m1": {"noise-aware": (0.023, 0.008), "bernstein-sheldon": (0.034, 0.011),
           "naive": (0.232, 0.003)},
    "m2": {"noise-aware": (0.016, 0.006), "bernstein-sheldon": (0.018, 0.006),
           "naive": (0.273, 0.007)},
    "m3": {"noise-aware": (0.020, 0.004), "bernstein-sheldon": (0.017, 0.007),
           "naive": (0.355, 0.009)},
}
MODEL_NAMES = {"m1": "Gamma–Exponential", "m2": "Beta–Bernoulli", "m3": "Dirichlet–Categorical"}
METHODS = ("noise-aware", "naive", "bernstein-sheldon")

#: Names the Bernstein–Sheldon example plugin may register its mechanism under.
BERNSTEIN_SHELDON_NAMES = ("bernstein-sheldon", "bernstein_sheldon")
BERNSTEIN_SHELDON_DIST = "dpppl-bernstein-sheldon"

#: NA-DPVI options of --smoke: far too few steps for a meaningful posterior, but every code path
#: (DP-SGD, NUTS post-processing, TARP) runs in seconds.
SMOKE_OPTIONS = {"steps": 300, "tune": 200, "draws": 200, "chains": 1}


# -- the models: written as any PyMC user would; the observations are placeholders, since a TARP
# -- study simulates every data set from the model itself.


def gamma_exponential(n: int = N_RECORDS) -> pm.Model:
    with pm.Model() as model:
        rate = pm.Gamma("rate", alpha=8.0, beta=2.0)
        pm.Exponential("x", lam=rate, observed=np.ones(n))
    return model


def beta_bernoulli(n: int = N_RECORDS, prior: tuple[float, float] = (10.0, 10.0)) -> pm.Model:
    with pm.Model() as model:
        p = pm.Beta("p", alpha=prior[0], beta=prior[1])
        pm.Bernoulli("x", p=p, observed=np.zeros(n, dtype=int))
    return model


def dirichlet_categorical(n: int = N_RECORDS) -> pm.Model:
    with pm.Model(coords={"category": ["a", "b", "c"]}) as model:
        p = pm.Dirichlet("p", a=np.full(3, 5.0), dims="category")
        pm.Categorical("x", p=p, observed=np.zeros(n, dtype=int))
    return model


MODELS = {"m1": gamma_exponential, "m2": beta_bernoulli, "m3": dirichlet_categorical}


# -- the Bernstein–Sheldon baseline, if its plugin is installed


def bernstein_sheldon() -> tuple[str | None, str]:
    """The baseline's mechanism name, or None and the reason it is not available."""
    installed = dpppl.mechanisms()
    for name in BERNSTEIN_SHELDON_NAMES:
        if name in installed:
            return name, f"mechanism {name!r} is installed"
    try:
        distribution(BERNSTEIN_SHELDON_DIST)
        why = (f"the distribution {BERNSTEIN_SHELDON_DIST} is installed but registers none of "
               f"the mechanisms {list(BERNSTEIN_SHELDON_NAMES)}")
    except PackageNotFoundError:
        why = (f"the example plugin {BERNSTEIN_SHELDON_DIST} is not installed (pip install -e "
               "tutorials/plugin_example/dpppl-bernstein-sheldon)")
    return None, why


# -- studies


def run_study(key: str, method: str, args: argparse.Namespace, mechanism_bs: str | None):
    """One TARP study; returns it and its wall time in seconds."""
    if key == "m2":
        model = beta_bernoulli(args.records, tuple(args.m2_prior))
    else:
        model = MODELS[key](args.records)
    if method == "bernstein-sheldon":
        mechanism, options = mechanism_bs, {}
    else:
        mechanism = "na-dpvi"
        options = {"posterior": method, **(SMOKE_OPTIONS if args.smoke else {})}
    start = time.perf_counter()
    study = dpppl.tarp(
        model,
        mechanism=mechanism,
        epsilon=EPSILON,
        delta=DELTA,
        n_simulations=args.simulations,
        n_workers=args.workers,
        random_seed=args.seed,
        progressbar=not args.smoke,
        **options,
    )
    return study, time.perf_counter() - start


def study_path(out: Path, key: str, method: str, k: int) -> Path:
    return out / f"{key}_{method}_K{k}.nc"


def record(out: Path, key: str, method: str, study: xr.Dataset, seconds: float, argv) -> dict:
    """Merge one study's summary into ``out/results.json`` (written after every study)."""
    rmse = study["rmse"]
    row = {
        "model": key,
        "method": method,
        "K": int(study.attrs["n_simulations"]),
        "rmse_mean": round(float(rmse.mean()), 4),
        "rmse_std": round(float(rmse.std()), 4),
        "paper": PAPER[key].get(method),
        "wall_s": round(seconds, 1),
        "workers": argv.workers,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.system()}",
        "command": "python " + " ".join(sys.argv),
        "fits_with_warnings": int(study.attrs.get("fits_with_warnings", 0)),
    }
    path = out / "results.json"
    rows = json.loads(path.read_text()) if path.exists() else {}
    rows[f"{key}/{method}/K{row['K']}"] = row
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    return row


def print_table(rows: list[dict], n_records: int = N_RECORDS) -> None:
    print(f"\nJoint TARP RMSE at ε = {EPSILON}, δ = {DELTA:g}, N = {n_records} "
          "(mean ± std over 20 reference repeats)")
    print(f"{'model':<22} {'method':<18} {'K':>4} {'dpppl':>15} {'paper (K=500)':>15} "
          f"{'wall':>8}")
    for row in rows:
        paper = row["paper"]
        paper_text = f"{paper[0]:.3f} ± {paper[1]:.3f}" if paper else "-"
        wall = f"{row['wall_s'] / 60:.1f} min" if row.get("wall_s") else ""
        print(f"{MODEL_NAMES[row['model']]:<22} {row['method']:<18} {row['K']:>4} "
              f"{row['rmse_mean']:>7.3f} ± {row['rmse_std']:.3f} {paper_text:>15} {wall:>8}")


def report(out: Path) -> None:
    path = out / "results.json"
    if not path.exists():
        sys.exit(f"no results in {out}: run the studies first")
    print_table(list(json.loads(path.read_text()).values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CI size: K = 4, N = 500, 300 DP-SGD steps, one process")
    parser.add_argument("--simulations", type=int, default=None, help="K (default 500)")
    parser.add_argument("--records", type=int, default=None, help="N (default 5000)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--workers", type=int, default=None, help="processes (default 2)")
    parser.add_argument("--m2-prior", type=float, nargs=2, default=(10.0, 10.0),
                        metavar=("A", "B"), help="Beta prior of M2 (default 10 10, the authors')")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default tutorials/exponential_families; a "
                        "temporary folder with --smoke)")
    parser.add_argument("--report", action="store_true", help="print the saved table and stop")
    args = parser.parse_args()
    if args.smoke:
        args.simulations = args.simulations or 4
        args.records = args.records or 500
        args.workers = args.workers or 1
        args.out = args.out or Path(tempfile.mkdtemp(prefix="dpppl-expfam-"))
    else:
        args.simulations = args.simulations or 500
        args.records = args.records or N_RECORDS
        args.workers = args.workers or 2
        args.out = args.out or Path(__file__).resolve().parent / "exponential_families"
    if args.report:
        report(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)

    mechanism_bs, why = bernstein_sheldon()
    methods = list(args.methods)
    if "bernstein-sheldon" in methods and mechanism_bs is None:
        print(f"Bernstein–Sheldon rows skipped: {why}.")
        methods.remove("bernstein-sheldon")

    rows = []
    for key in args.models:
        for method in methods:
            try:
                study, seconds = run_study(key, method, args, mechanism_bs)
            except dpppl.DPPPLError as error:
                if method != "bernstein-sheldon":
                    raise
                print(f"Bernstein–Sheldon skipped for {MODEL_NAMES[key]}: {error}")
                continue
            path = study_path(args.out, key, method, args.simulations)
            study.to_netcdf(path)
            dpppl.plot_tarp(
                study,
                path.with_suffix(".png"),
                title=f"{MODEL_NAMES[key]}, {method}: ε = {EPSILON}, N = {args.records}, "
                f"K = {args.simulations}",
            )
            row = record(args.out, key, method, study, seconds, args)
            rows.append(row)
            print(f"{MODEL_NAMES[key]}, {method}: joint RMSE {row['rmse_mean']:.3f} ± "
                  f"{row['rmse_std']:.3f} ({seconds:.0f} s) -> {path}", flush=True)
    print_table(rows, args.records)
    print(f"\nStudies and figures saved in {args.out}")


if __name__ == "__main__":
    main()
