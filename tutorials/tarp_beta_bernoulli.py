"""Noise-aware TARP of NA-DPVI on the Beta–Bernoulli model (NA-DPVI paper, Table 1).

Beta(1, 1) prior, N = 5000 Bernoulli records, ε = 0.1, δ = 1e-5, NA-DPVI at its defaults
(T = 10⁴ DP-SGD steps, κ = 0.1, NUTS post-processing) against the naive posterior q(θ; φ_T) that
ignores the privacy noise.  Each study simulates K data sets from the model and fits each one;
it reads no private data and spends no privacy budget.

    python tutorials/tarp_beta_bernoulli.py --simulations 200            # 2 local processes
    python tutorials/tarp_beta_bernoulli.py --simulations 500 --dask 2   # a 2-worker LocalCluster

Prints the joint RMSE of the coverage error (mean ± std over 20 reference repeats) next to the
paper's, the wall time of each study, and saves the coverage plots as PNG.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pymc as pm

import dpppl

#: Paper, Table 1 (K = 500, 20 reference repeats): joint TARP RMSE, mean ± std.
PAPER = {"noise-aware": (0.016, 0.006), "naive": (0.273, 0.007)}
N_RECORDS = 5000


def beta_bernoulli_model() -> pm.Model:
    """The model; its observations are placeholders, since TARP simulates every data set."""
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=np.zeros(N_RECORDS, dtype=int))
    return model


def run_study(model, posterior, args, client=None):
    start = time.perf_counter()
    study = dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=0.1,
        delta=1e-5,
        posterior=posterior,
        n_simulations=args.simulations,
        n_workers=None if client is not None else args.workers,
        client=client,
        random_seed=args.seed,
    )
    return study, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", type=int, default=200, help="K")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--dask", type=int, default=0, help="use a LocalCluster of this size")
    parser.add_argument("--posterior", choices=("noise-aware", "naive", "both"), default="both")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--out", type=Path, default=Path("tutorials/tarp_beta_bernoulli"))
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    model = beta_bernoulli_model()
    posteriors = ("noise-aware", "naive") if args.posterior == "both" else (args.posterior,)
    client = cluster = None
    if args.dask:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=args.dask, threads_per_worker=1, processes=True)
        client = Client(cluster)
    rows = []
    try:
        for posterior in posteriors:
            study, seconds = run_study(model, posterior, args, client)
            study.to_netcdf(args.out / f"{posterior}_K{args.simulations}.nc")
            dpppl.plot_tarp(
                study,
                args.out / f"{posterior}_K{args.simulations}.png",
                title=f"NA-DPVI, {posterior} posterior: ε = 0.1, N = {N_RECORDS}, "
                f"K = {args.simulations}",
            )
            rmse = study["rmse"]
            rows.append((posterior, float(rmse.mean()), float(rmse.std()), seconds))
    finally:
        if client is not None:
            client.close()
            cluster.close()

    executor = (
        f"Dask LocalCluster, {args.dask} workers" if args.dask else f"{args.workers} processes"
    )
    print(f"\nBeta–Bernoulli, N = {N_RECORDS}, ε = 0.1, δ = 1e-5, K = {args.simulations}, "
          f"{executor}")
    print(f"{'posterior':<12} {'joint RMSE (ours)':>20} {'paper (K = 500)':>18} {'wall time':>10}")
    for posterior, mean, std, seconds in rows:
        paper = PAPER[posterior]
        print(f"{posterior:<12} {mean:>11.3f} ± {std:.3f} {paper[0]:>10.3f} ± {paper[1]:.3f} "
              f"{seconds / 60:>8.1f} min")


if __name__ == "__main__":
    main()
