"""Model files: how ``dpppl fit MODEL.py --data DATA.csv`` gets a PyMC model.

The contract: ``MODEL.py`` is a Python file that defines

.. code-block:: python

    def build_model(data: pandas.DataFrame) -> pymc.Model: ...

``data`` is ``DATA.csv`` read by ``pandas.read_csv`` with its defaults (a header line; empty
fields and ``NA`` read as missing).  The model must hold the records the way
:func:`dpppl.sample` finds them: observed variables (and ``pm.Data`` covariates) that share a
leading record dimension, best named with ``dims``.  :data:`EXAMPLE_MODEL_FILE` is an example.

The file runs with its own folder on ``sys.path``, so it may import modules beside it.

Errors raised by the user's code are reported by type and place only: their messages can quote
data values, which must not reach a terminal log.

pandas and PyMC are imported where they are used: ``dpppl --help`` shows
:data:`EXAMPLE_MODEL_FILE` and should not wait for them.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from dpppl.errors import DPPPLError

if TYPE_CHECKING:
    import pandas as pd
    import pymc as pm

#: The function a model file must define.
BUILDER = "build_model"

#: A model file for a CSV with columns x1, x2 and a 0/1 outcome y: a logistic regression.
EXAMPLE_MODEL_FILE = """\
import pymc as pm

def build_model(data):
    coords = {"obs": data.index, "feature": ["x1", "x2"]}
    with pm.Model(coords=coords) as model:
        X = pm.Data("X", data[["x1", "x2"]].to_numpy(), dims=("obs", "feature"))
        w = pm.Normal("w", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=X @ w, observed=data["y"].to_numpy(), dims="obs")
    return model
"""


class ModelFileError(DPPPLError):
    """A model file or data file cannot give a model (missing, broken, or against the contract)."""


def load_model_file(path: str | Path) -> Callable[[pd.DataFrame], pm.Model]:
    """Run the model file at ``path`` and return its ``build_model`` function.

    Raises
    ------
    ModelFileError
        If the file does not exist, raises while it runs, or defines no callable
        ``build_model``.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} not found")
    spec = importlib.util.spec_from_file_location(f"dpppl_model_file_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path} cannot be loaded as Python: name it with a .py suffix")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - any error of the user's code is reported alike
        raise ModelFileError(user_code_error(f"running {path}", error, path)) from None
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return _builder(module, path)


def _builder(module: ModuleType, path: Path) -> Callable[[pd.DataFrame], pm.Model]:
    builder = getattr(module, BUILDER, None)
    if not callable(builder):
        raise ModelFileError(
            f"{path} defines no function {BUILDER}(data); it must define "
            f"`def {BUILDER}(data: pandas.DataFrame) -> pymc.Model` (see `dpppl fit --help`)"
        )
    return builder


def read_data_file(path: str | Path) -> pd.DataFrame:
    """Read the CSV data file of ``dpppl fit``.

    Raises
    ------
    ModelFileError
        If the file does not exist or is not readable as CSV (the parser's message is withheld:
        it can quote the data).
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"data file {path} not found")
    try:
        return pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError) as error:
        raise ModelFileError(
            f"{path} cannot be read as a CSV file with a header line "
            f"({type(error).__name__}; the parser's message is withheld as it may quote the data)"
        ) from None


def build_model_from_files(model_path: str | Path, data_path: str | Path) -> pm.Model:
    """``build_model(read_data_file(data_path))`` of the model file at ``model_path``.

    Raises
    ------
    ModelFileError
        If a file is missing or broken, ``build_model`` raises, or it returns no ``pm.Model``.
    """
    import pymc as pm

    builder = load_model_file(model_path)
    data = read_data_file(data_path)
    try:
        model = builder(data)
    except Exception as error:  # noqa: BLE001 - any error of the user's code is reported alike
        raise ModelFileError(
            user_code_error(f"{BUILDER}(data) of {model_path}", error, Path(model_path))
        ) from None
    if not isinstance(model, pm.Model):
        raise ModelFileError(
            f"{BUILDER}(data) of {model_path} returned a {type(model).__name__}, not a pymc.Model"
        )
    return model


def user_code_error(action: str, error: BaseException, path: Path) -> str:
    """Describe an error of the user's code by its type and the last line of ``path`` it passed.

    The exception's message is left out on purpose: it can quote data values.
    """
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if Path(frame.filename).resolve() == path.resolve()
    ]
    where = ""
    if frames:
        last = frames[-1]
        where = f" at {path}:{last.lineno}" + (f" (`{last.line.strip()}`)" if last.line else "")
    return (
        f"{action} raised {type(error).__name__}{where}. Its message is not shown because it may "
        "quote data values; run the model file in Python to see it"
    )
