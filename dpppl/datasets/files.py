"""Where the data files are, and fetching them: the search order of :mod:`dpppl.datasets`,
and the one HTTP download dpppl makes (public data sets only)."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from dpppl.errors import DPPPLError
from dpppl.user_cache import cache_dir

#: Environment variable naming the data folder.
DATA_ENV = "DPPPL_DATA"

#: Seconds a download may stall before it is abandoned.
DOWNLOAD_TIMEOUT_S = 60


class DatasetNotFoundError(DPPPLError, FileNotFoundError):
    """A data file is in none of the places dpppl looks (the message lists them)."""


class DatasetDownloadError(DPPPLError, OSError):
    """A data file could not be downloaded (no network, or the source moved)."""


# -- where the data are --------------------------------------------------------------------------


def checkout_data_dir() -> Path | None:
    """``../shared/data`` beside the source checkout dpppl runs from, if that folder exists."""
    candidate = Path(__file__).resolve().parents[3] / "shared" / "data"
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
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
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
