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

Modules: :mod:`~dpppl.datasets.files` (the search and the download), :mod:`~dpppl.datasets.adult`
and :mod:`~dpppl.datasets.uci_regression`.
"""

from dpppl.datasets.adult import (
    ADULT_COLUMNS,
    ADULT_CONTINUOUS,
    ADULT_DROPPED,
    ADULT_FILES,
    ADULT_LABEL,
    ADULT_NEGATIVE,
    ADULT_POSITIVE,
    UCI_ADULT_URL,
    AdultEncoding,
    adult_path,
    download_uci_adult,
    income_labels,
    load_adult_sample,
    load_uci_adult,
    preprocess_adult,
    read_adult_csv,
)
from dpppl.datasets.files import (
    DATA_ENV,
    DOWNLOAD_TIMEOUT_S,
    DatasetDownloadError,
    DatasetNotFoundError,
    checkout_data_dir,
    data_dirs,
    download_dir,
    fetch,
    find_data_file,
)
from dpppl.datasets.uci_regression import (
    REGRESSION_FILES,
    REGRESSION_SETTINGS,
    UCI_REGRESSION_SETS,
    UCI_REGRESSION_URL,
    UCIRegressionData,
    download_uci_regression,
    load_uci_regression,
    regression_path,
)

__all__ = [
    "ADULT_COLUMNS",
    "ADULT_CONTINUOUS",
    "ADULT_DROPPED",
    "ADULT_FILES",
    "ADULT_LABEL",
    "ADULT_NEGATIVE",
    "ADULT_POSITIVE",
    "AdultEncoding",
    "DATA_ENV",
    "DOWNLOAD_TIMEOUT_S",
    "DatasetDownloadError",
    "DatasetNotFoundError",
    "REGRESSION_FILES",
    "REGRESSION_SETTINGS",
    "UCIRegressionData",
    "UCI_ADULT_URL",
    "UCI_REGRESSION_SETS",
    "UCI_REGRESSION_URL",
    "adult_path",
    "checkout_data_dir",
    "data_dirs",
    "download_dir",
    "download_uci_adult",
    "download_uci_regression",
    "fetch",
    "find_data_file",
    "income_labels",
    "load_adult_sample",
    "load_uci_adult",
    "load_uci_regression",
    "preprocess_adult",
    "read_adult_csv",
    "regression_path",
]
