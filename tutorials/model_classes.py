"""Is NA-DPVI calibrated on one model of each class users fit?  TARP studies at ε = 1.

The classes are those of ``dpppl.testing.model_classes()`` (the models NA-DPVI's CI-size
calibration tests run at K = 40): a logistic and a Poisson regression on three correlated
covariates, a normal regression with an unknown noise scale, varying intercepts over five public
groups (written centred, and non-centred), and the demo's logistic regression on the bundled
Adult sample.  Each study simulates K data sets from the model's prior, fits each privately at
NA-DPVI's defaults (10,000 DP-SGD steps; NUTS with 300 tuning steps and 500 draws) and prints a
JSON row: joint and marginal TARP RMSE, the fits' warnings and the wall time.  The K = 200 rows
of ``tutorials/RESULTS.md``::

    python tutorials/model_classes.py logistic poisson unknown_scale --simulations 200
    python tutorials/model_classes.py varying_intercepts_centred demo --simulations 200

A calibrated posterior's joint RMSE is 0.026 ± 0.011 at K = 200 (0.037 ± 0.015 at K = 100).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from held_out_models import run_study
from linear_regression import parse_option

from dpppl.testing import model_classes


def class_study(name: str, args: argparse.Namespace, options: dict) -> dict:
    """One TARP study of class ``name``: its summary row (and the study saved under --out)."""
    chosen = model_classes()[name]
    return run_study(name, chosen.build(), chosen.covariates, args, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("classes", nargs="+", choices=sorted(model_classes()), metavar="CLASS")
    parser.add_argument("--simulations", type=int, default=200, help="K simulated data sets")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--workers", type=int, default=2, help="processes for each study")
    parser.add_argument("--out", type=Path, default=None, help="folder for the studies' netcdf")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an NA-DPVI option, e.g. postprocessing=optimum (repeatable)",
    )
    parser.add_argument("--smoke", action="store_true", help="K = 2, 300 steps")
    args = parser.parse_args()
    options = dict(parse_option(o) for o in args.option)
    for name in args.classes:
        print(json.dumps(class_study(name, args, options)), flush=True)


if __name__ == "__main__":
    main()
