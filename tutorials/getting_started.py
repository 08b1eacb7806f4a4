"""Getting started with dpppl: make an existing PyMC model differentially private.

A plain-text tutorial: read it top to bottom, or run it from the repository root:

    python tutorials/getting_started.py            # the real thing: a few minutes on 2 cores
    python tutorials/getting_started.py --smoke    # seconds-scale settings, for CI

It writes what it shows into ``tutorials/getting_started/`` (``--out`` to change): the printed
output, the ArviZ summary, a forest plot, the TARP coverage plot and the result as netCDF.

Steps:

1. an ordinary PyMC logistic regression on the 2000-row UCI Adult sample that ships with dpppl;
2. the same model fitted privately: one call, ``dpppl.sample`` inside ``with model:``;
3. the privacy guarantee read back from the result;
4. ArviZ: ``az.summary`` and ``az.plot_forest`` work on the result as on any ``pm.sample`` output;
5. TARP: is this private posterior calibrated?  Checked on simulated data sets with synthetic
   covariates, so the check spends no privacy budget;
6. saving with ``to_netcdf`` and loading back: the guarantee travels with the file.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import xarray as xr

import dpppl
import dpppl.datasets

SMOKE_OPTIONS = {"steps": 300, "tune": 200, "draws": 200, "chains": 1}


# -- 1. the model: nothing in it is about privacy -----------------------------------------------


def adult_features(frame):
    """Age, education level, weekly hours and sex, on fixed scales chosen in advance.

    The centring and scaling use round numbers, not the data's mean and sd: statistics of the
    private data would themselves leak something, outside any guarantee.
    """
    frame = frame.dropna(subset=["age", "education-num", "hours-per-week", "sex", "class"])
    X = np.column_stack([
        (frame["age"] - 40.0) / 10.0,             # per 10 years
        (frame["education-num"] - 10.0) / 3.0,    # per 3 education levels
        (frame["hours-per-week"] - 40.0) / 10.0,  # per 10 hours a week
        (frame["sex"] == "Male").astype(float),
    ])
    y = dpppl.datasets.income_labels(frame)
    return X, y


FEATURES = ["age", "education", "hours", "male"]


def make_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    coords = {"person": np.arange(len(y)), "feature": FEATURES}
    with pm.Model(coords=coords) as model:
        x = pm.Data("X", X, dims=("person", "feature"))
        intercept = pm.Normal("intercept", 0.0, 2.5)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        pm.Bernoulli("income_over_50k", logit_p=intercept + x @ w, observed=y, dims="person")
    return model


# -- 5. synthetic covariates for the TARP check -------------------------------------------------


class SyntheticPeople:
    """``rng -> {"X": ...}``: made-up people on the same scales as :func:`adult_features`.

    TARP simulates whole data sets from the model.  Its covariates must not be the private ones
    (that check would not be private), so we invent plausible ones from public knowledge:
    ages 17–90, education levels 1–16, 1–99 working hours a week, about two thirds men.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        age = rng.uniform(17, 90, self.n)
        education = rng.integers(1, 17, self.n)
        hours = np.clip(rng.normal(40, 12, self.n), 1, 99)
        male = rng.random(self.n) < 0.67
        X = np.column_stack([(age - 40) / 10, (education - 10) / 3, (hours - 40) / 10, male])
        return {"X": X.astype(float)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="seconds-scale settings, for CI")
    parser.add_argument("--simulations", type=int, default=None,
                        help="TARP simulated data sets (default 50; 3 with --smoke)")
    parser.add_argument("--workers", type=int, default=None,
                        help="TARP worker processes (default 2; 1 with --smoke)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the outputs (default tutorials/getting_started)")
    args = parser.parse_args()
    out = args.out or Path(__file__).resolve().parent / "getting_started"
    out.mkdir(parents=True, exist_ok=True)
    simulations = args.simulations or (3 if args.smoke else 50)
    workers = args.workers or (1 if args.smoke else 2)
    options = SMOKE_OPTIONS if args.smoke else {}   # NA-DPVI's defaults: the paper's settings

    # Everything printed below is also written to out/output.txt.
    log = io.StringIO()

    def show(*lines: object) -> None:
        text = "\n".join(str(line) for line in lines)
        print(text, flush=True)
        log.write(text + "\n")

    # 1. Data and an ordinary PyMC model.
    frame = dpppl.datasets.load_adult_sample()
    X, y = adult_features(frame)
    model = make_model(X, y)
    show(f"1. Data: {len(y)} people from the UCI Adult sample, {X.shape[1]} features; "
         f"{y.mean():.1%} earn more than 50K.")

    # 2. The private fit: this is the whole change to a PyMC workflow.  The seed is fixed only to
    #    make the tutorial reproducible; leave it out for a release (see the statement below).
    start = time.perf_counter()
    with model:
        idata = dpppl.sample(
            mechanism="na-dpvi",
            epsilon=1.0,
            delta=1e-5,
            random_seed=2025,
            progressbar=False,
            tarp={
                "covariates": SyntheticPeople(len(y)),
                "n_simulations": simulations,
                "n_workers": workers,
                "random_seed": 7,
            },
            **options,
        )
    show(f"\n2. dpppl.sample(mechanism='na-dpvi', epsilon=1.0, delta=1e-5, tarp=...) took "
         f"{time.perf_counter() - start:.0f} s (fit and {simulations} TARP simulations).")
    show(f"   Groups of the result: {sorted(idata.children)}")

    # 3. What was spent, read back from the result itself.
    show("\n3. Privacy statement:", dpppl.privacy_statement(idata))
    show(f"   idata.attrs['dp_epsilon'] = {idata.attrs['dp_epsilon']:.3f}, "
         f"dp_delta = {idata.attrs['dp_delta']:g}, "
         f"dp_neighbour_relation = {idata.attrs['dp_neighbour_relation']!r}")

    # 4. ArviZ works as usual.
    summary = az.summary(idata, var_names=["intercept", "w"], kind="stats")
    show("\n4. az.summary(idata, var_names=['intercept', 'w'], kind='stats'):",
         summary.round(2).to_string())
    (out / "summary.txt").write_text(summary.to_string() + "\n")
    forest = az.plot_forest(idata, var_names=["intercept", "w"], combined=True,
                            backend="matplotlib")
    forest.savefig(out / "forest.png")
    show(f"   forest plot of the private posterior -> {out / 'forest.png'}")

    # 5. TARP: expected coverage of the private posterior's credible regions on simulated data.
    show("\n5. TARP check (no privacy budget spent):", idata["tarp"].attrs["privacy_note"],
         dpppl.diagnostics.coverage_summary(idata["tarp"]))
    dpppl.plot_tarp(idata, out / "tarp.png")
    show(f"   coverage plot -> {out / 'tarp.png'}")
    if simulations < 100:
        show(f"   ({simulations} simulations: a rough check; use hundreds for a verdict, e.g. "
             "dpppl.add_tarp(idata, model, covariates=..., n_simulations=500))")

    # 6. Save and load back.
    path = out / "adult_private_posterior.nc"
    idata.to_netcdf(path)
    loaded = xr.open_datatree(path)
    same = np.allclose(loaded.posterior["w"].values, idata.posterior["w"].values)
    show(f"\n6. Saved to {path} and loaded back with xarray.open_datatree: posterior identical: "
         f"{same}; dp_epsilon = {loaded.attrs['dp_epsilon']:.3f}; groups {sorted(loaded.children)}")
    show("   What the file does not contain: "
         f"{[g for g in ('observed_data', 'constant_data', 'log_likelihood') if g in loaded]} "
         "(no data, no per-record values)")
    loaded.close()

    (out / "output.txt").write_text(log.getvalue())
    show(f"\nDone. Outputs in {out}")


if __name__ == "__main__":
    main()
