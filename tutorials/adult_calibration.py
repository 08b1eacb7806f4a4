"""NA-DPVI on UCI Adult: predictive calibration of a private logistic regression (paper, Table 3).

Reproduces Section 4.4 and Appendix H.6 of Ahmed, Jälkö, Honkela et al., "Noise-aware
differentially private variational inference" (AISTATS 2025) with dpppl:

* data: UCI Adult, training split to fit, test split held out.  Preprocessing as in H.6 (by
  ``dpppl.datasets.AdultEncoding``): drop ``education-num``, ``native-country`` and
  ``relationship``, one-hot encode the categorical columns, scale the continuous ones to [0, 1],
  drop rows with a missing value; 30,718 training rows × 56 features, 15,315 test rows.
* model: Bayesian logistic regression, standard normal prior on the 56 weights and the bias.
* privacy: ε ∈ {0.1, 0.3, 1}, δ = 1e-5, NA-DPVI with T = 10⁴ DP-SGD steps, κ = 0.1.
* evaluation: the posterior-predictive probability p̃(y = 1 | x) of each test record (eq. 29,
  averaged over posterior draws), binned; the calibration error of a bin is (fraction of
  positives − mean predicted probability) and the summary is its RMSE over the bins, mean ± std
  over repeated private fits (the paper: 20).  The paper reports it × 10³.

Methods: ``nuts`` and ``laplace`` (NA-DPVI's two post-processing engines) and ``naive``, the last
DP-SGD iterate q(θ; φ_T).  The naive posterior needs no fit of its own: it is read off the DP-SGD
trace that every NA-DPVI result releases (group ``dpvi_trace``), so each NUTS fit gives both.

Two binnings are reported: ten equal-width bins on [0, 1] (``dpppl.diagnostics`` default) and ten
equal-count bins (quantiles of the predictions, as in the authors' plotting code).

Data: ``dpppl.datasets.load_uci_adult`` looks in ``$DPPPL_DATA``, the user cache
(``~/.cache/dpppl``) and ``../shared/data`` beside a source checkout, and says what to do when the
files are missing (``--download`` fetches them from UCI).  ``--smoke`` uses the 2000-row sample
that ships with dpppl instead, so it runs anywhere.

    python tutorials/adult_calibration.py --smoke                 # CI size, about a minute
    python tutorials/adult_calibration.py                         # full data, 20 repeats: hours
    python tutorials/adult_calibration.py --repeats 5 --methods nuts --epsilon 1
    python tutorials/adult_calibration.py --repeats 6 --epsilon 0.3 --option anchored=0.5

Each fit's test predictions are saved as they land (``<out>/predictions.nc``); ``--report``
recomputes the table and figures from them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pymc as pm
import xarray as xr
from linear_regression import parse_option
from matplotlib.figure import Figure
from scipy.special import expit

import dpppl
import dpppl.datasets as datasets
from dpppl.diagnostics import plot_reliability, predictive_calibration, save_png

DELTA = 1e-5
EPSILONS = (0.1, 0.3, 1.0)
METHODS = ("nuts", "laplace", "naive")
N_BINS = 10
#: Posterior draws used for the predictive average (evenly thinned).
PREDICTIVE_DRAWS = 2000

#: Paper, Table 3: calibration RMSE × 10³, mean ± std over 20 repeats.
PAPER = {
    "nuts": {0.1: (61, 31), 0.3: (26, 5), 1.0: (24, 7)},
    "laplace": {0.1: (84, 43), 0.3: (44, 11), 1.0: (46, 14)},
    "naive": {0.1: (120, 65), 0.3: (67, 24), 1.0: (54, 17)},
}

SMOKE_OPTIONS = {"steps": 300, "tune": 200, "draws": 200, "chains": 1}


def load_data(smoke: bool, data_dir: str | None, download: bool):
    """Encoded train and test features and labels (the paper's H.6 preprocessing)."""
    if smoke:
        sample = datasets.load_adult_sample()
        train, test = sample.iloc[:1500], sample.iloc[1500:]
    else:
        try:
            train = datasets.load_uci_adult("train", data_dir, download=download)
            test = datasets.load_uci_adult("test", data_dir, download=download)
        except datasets.DatasetNotFoundError as error:
            sys.exit(f"{error}\n(or run with --smoke to use the sample that ships with dpppl)")
    # The encoding (category lists, value ranges) is read off the training split, as the paper
    # does.  With private data, build AdultEncoding from public knowledge instead: fitting it
    # reads the data outside any privacy guarantee.
    encoding = datasets.AdultEncoding.fit(train)
    X_train, y_train = encoding.transform(train)
    X_test, y_test = encoding.transform(test)
    return X_train, y_train, X_test.to_numpy(), y_test


def logistic_regression(X: pd.DataFrame, y: np.ndarray) -> pm.Model:  # noqa: F821
    coords = {"person": np.arange(len(y)), "feature": list(X.columns)}
    with pm.Model(coords=coords) as model:
        x = pm.Data("X", X.to_numpy(), dims=("person", "feature"))
        bias = pm.Normal("bias", 0.0, 1.0)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        pm.Bernoulli("income_over_50k", logit_p=x @ w + bias, observed=y, dims="person")
    return model


def predictive(w: np.ndarray, bias: np.ndarray, X: np.ndarray) -> np.ndarray:
    """p̃(y = 1 | x) = mean over draws of σ(x·w + b): eq. (29) by Monte Carlo."""
    return expit(X @ w.T + bias).mean(axis=1)


def thin(a: np.ndarray, n: int) -> np.ndarray:
    return a[np.linspace(0, a.shape[0] - 1, min(n, a.shape[0])).round().astype(int)]


def naive_draws(idata: xr.DataTree, n_features: int, n: int, seed: int):
    """Draws of q(θ; φ_T) from the released DP-SGD trace (the naive, last-iterate posterior).

    φ = (μ, u) over the unconstrained parameters in the model's order (bias, w), variances
    softplus(u); here every parameter is unconstrained, so θ = its unconstrained value.
    """
    trace = idata["dpvi_trace"]
    labels = [str(v) for v in trace["vi_param"].values]
    phi = trace["phi"].values[-1]
    d = len(labels) // 2
    mu, sd = phi[:d], np.sqrt(np.logaddexp(0.0, phi[d:]))
    theta = mu + sd * np.random.default_rng(seed).standard_normal((n, d))
    names = labels[:d]
    bias_col = [i for i, name in enumerate(names) if name.startswith("mu[bias")]
    w_cols = [i for i, name in enumerate(names) if name.startswith("mu[w")]
    assert len(bias_col) == 1 and len(w_cols) == n_features, names[:3]
    return theta[:, w_cols], theta[:, bias_col[0]]


def posterior_draws(idata: xr.DataTree, n: int):
    post = idata.posterior
    w = post["w"].values.reshape(-1, post["w"].shape[-1])
    bias = post["bias"].values.reshape(-1)
    return thin(w, n), thin(bias, n)


def quantile_edges(p: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Equal-count bin edges for one set of predictions (the authors' binning)."""
    inner = np.quantile(p, np.linspace(0, 1, n_bins + 1)[1:-1])
    return np.unique(np.concatenate([[0.0], inner, [1.0]]))


def calibration_rmse(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(equal-width, equal-count) calibration RMSE of one fit's predictions."""
    width = float(predictive_calibration(p, y, bins=N_BINS)["rmse"].values[0])
    count = float(predictive_calibration(p, y, bins=quantile_edges(p))["rmse"].values[0])
    return width, count


def save_predictions(out: Path, rows: list[dict], y_test: np.ndarray) -> None:
    """All predictions so far, one row per (ε, method, repeat), as netCDF."""
    ds = xr.Dataset(
        {
            "probability": (("fit", "record"), np.stack([r["p"] for r in rows])),
            "outcome": ("record", y_test),
            "wall_s": ("fit", [r["wall_s"] for r in rows]),
        },
        coords={
            "epsilon": ("fit", [r["epsilon"] for r in rows]),
            "method": ("fit", [r["method"] for r in rows]),
            "repeat": ("fit", [r["repeat"] for r in rows]),
        },
        attrs={"description": "posterior-predictive probabilities of the UCI Adult test records"},
    )
    ds.to_netcdf(out / "predictions.nc")


def summarise(ds: xr.Dataset, out: Path, meta: dict) -> list[dict]:
    """Table rows and reliability figures from saved predictions."""
    y = ds["outcome"].values
    table = []
    for epsilon in sorted(set(ds["epsilon"].values.tolist())):
        at_eps = ds["epsilon"].values == epsilon
        present = [m for m in METHODS if (at_eps & (ds["method"].values == m)).any()]
        fig = Figure(figsize=(5.5 * len(present), 6.5), layout="constrained")
        axes = fig.subplots(2, len(present), sharex=True, height_ratios=(2, 1), squeeze=False)
        for col, method in enumerate(present):
            pick = at_eps & (ds["method"].values == method)
            probs = ds["probability"].values[pick]
            scores = np.array([calibration_rmse(p, y) for p in probs]) * 1e3
            calib = predictive_calibration(probs, y, bins=N_BINS)
            plot_reliability(calib, axes=axes[:, col], label=f"{method}, ε = {epsilon:g}")
            table.append({
                "epsilon": epsilon, "method": method, "repeats": int(pick.sum()),
                "rmse_width_x1000": [round(scores[:, 0].mean(), 1), round(scores[:, 0].std(), 1)],
                "rmse_count_x1000": [round(scores[:, 1].mean(), 1), round(scores[:, 1].std(), 1)],
                "paper_x1000": PAPER[method].get(epsilon),
                "mean_fit_s": round(float(ds["wall_s"].values[pick].mean()), 1),
                **meta,
            })
        fig.suptitle(f"UCI Adult, predictive calibration at ε = {epsilon:g} (equal-width bins)")
        save_png(fig, out / f"reliability_eps{epsilon:g}.png")
    (out / "results.json").write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
    return table


def print_table(table: list[dict]) -> None:
    print(f"\nCalibration RMSE × 10³ on the held-out test split, δ = {DELTA:g} (mean ± std over "
          "repeats)")
    print(f"{'method':<8} {'ε':>4} {'R':>3} {'equal-width':>13} {'equal-count':>13} "
          f"{'paper':>10} {'s/fit':>7}")
    for r in table:
        paper = r["paper_x1000"]
        paper_text = f"{paper[0]} ± {paper[1]}" if paper else "-"
        width, count = r["rmse_width_x1000"], r["rmse_count_x1000"]
        print(f"{r['method']:<8} {r['epsilon']:>4g} {r['repeats']:>3} "
              f"{width[0]:>6.0f} ± {width[1]:<4.0f} {count[0]:>6.0f} ± {count[1]:<4.0f} "
              f"{paper_text:>10} {r['mean_fit_s']:>7.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CI size: the bundled 2000-row sample, 300 DP-SGD steps, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="fits per ε (default 20)")
    parser.add_argument("--epsilon", type=float, nargs="+", default=None,
                        help="default 0.1 0.3 1 (1 only with --smoke)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="naive comes free with nuts or laplace")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--data", default=None, help="data folder (default: see dpppl.datasets)")
    parser.add_argument("--download", action="store_true", help="fetch missing files from UCI")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default tutorials/adult_calibration; a temporary "
                        "folder with --smoke)")
    parser.add_argument("--report", action="store_true",
                        help="recompute the table and figures from saved predictions")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an NA-DPVI option for the fits, e.g. anchored=0.5 (repeatable)")
    args = parser.parse_args()
    extra_options = dict(parse_option(text) for text in args.option)
    args.repeats = args.repeats or (1 if args.smoke else 20)
    args.epsilon = args.epsilon or ([1.0] if args.smoke else list(EPSILONS))
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="dpppl-adult-")) if args.smoke
                    else Path(__file__).resolve().parent / "adult_calibration")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.system()}",
        "command": "python " + " ".join(sys.argv),
    }
    if args.report:
        # Every predictions.nc under --out: runs split over several processes (one folder each)
        # are summarised together.
        files = sorted(args.out.rglob("predictions.nc"))
        if not files:
            sys.exit(f"no predictions.nc under {args.out}: run the fits first")
        parts = [xr.load_dataset(f) for f in files]
        ds = xr.concat(parts, dim="fit", data_vars="minimal", coords="different",
                       compat="equals")
        print(f"Summarising {ds.sizes['fit']} fits from {len(files)} file(s)")
        print_table(summarise(ds, args.out, meta))
        return

    X_train, y_train, X_test, y_test = load_data(args.smoke, args.data, args.download)
    print(f"UCI Adult: {len(y_train)} training records × {X_train.shape[1]} features, "
          f"{len(y_test)} test records; positive rate {y_train.mean():.3f}")
    model = logistic_regression(X_train, y_train)
    engines = [m for m in args.methods if m != "naive"] or ["nuts"]

    rows = []
    for epsilon in args.epsilon:
        for engine in engines:
            for repeat in range(args.repeats):
                options = {"inference": engine, **(SMOKE_OPTIONS if args.smoke else {}),
                           **extra_options}
                start = time.perf_counter()
                with model:
                    idata = dpppl.sample(
                        mechanism="na-dpvi", epsilon=epsilon, delta=DELTA,
                        random_seed=[args.seed, repeat, int(epsilon * 1000)],
                        progressbar=False, **options,
                    )
                seconds = time.perf_counter() - start
                scores = []
                if engine in args.methods:
                    p = predictive(*posterior_draws(idata, PREDICTIVE_DRAWS), X_test)
                    rows.append({"epsilon": epsilon, "method": engine, "repeat": repeat,
                                 "p": p, "wall_s": seconds})
                    scores.append(f"{engine} {1e3 * calibration_rmse(p, y_test)[0]:.0f}")
                if "naive" in args.methods and engine == engines[0]:
                    w, b = naive_draws(idata, X_train.shape[1], PREDICTIVE_DRAWS, repeat)
                    p = predictive(w, b, X_test)
                    rows.append({"epsilon": epsilon, "method": "naive", "repeat": repeat,
                                 "p": p, "wall_s": seconds})
                    scores.append(f"naive {1e3 * calibration_rmse(p, y_test)[0]:.0f}")
                save_predictions(args.out, rows, y_test)
                print(f"ε = {epsilon:g}, {engine} fit {repeat + 1}/{args.repeats} ({seconds:.0f} s):"
                      f" calibration RMSE × 10³ {', '.join(scores)}", flush=True)

    with xr.open_dataset(args.out / "predictions.nc") as ds:
        table = summarise(ds.load(), args.out, meta)
    print_table(table)
    print(f"\nPredictions, results.json and reliability figures saved in {args.out}")


if __name__ == "__main__":
    main()
