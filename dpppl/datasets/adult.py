"""UCI Adult: the files, a 2000-row sample shipped with dpppl, and the NA-DPVI paper's
preprocessing (:class:`AdultEncoding`)."""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from dpppl.datasets.files import DatasetNotFoundError, download_dir, fetch, find_data_file
from dpppl.errors import InvalidDataError

#: Where UCI serves the Adult files (``adult.data``, ``adult.test``).
UCI_ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"

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

ADULT_FILES = {"train": "adult.data", "test": "adult.test"}


# -- UCI Adult -----------------------------------------------------------------------------------


def adult_path(split: Literal["train", "test"] = "train") -> Path:
    """The path of an Adult split inside a data folder: ``uci-adult/adult.data`` or ``.test``."""
    if split not in ADULT_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return Path("uci-adult") / ADULT_FILES[split]


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
    for split in ADULT_FILES:
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
