"""Where the field's data sets come from, and the local cache they are read from.

Contract: :data:`SOURCES` names each data set's canonical public source (the URL of its
archive), what the archive holds, its citation and the terms it is published under.
:func:`local_files` returns the folder of a data set in the cache (``data_dir``, default
``$AISIM_DATA`` or ``~/.cache/aisim/fl``): it must already hold the data set's files, or, with
``download=True`` (``aisim fl run --download``), the archive is fetched from its source once,
unpacked there, and kept. Nothing is fetched otherwise: without the files and without
``download`` the error says which files are missing and how to get them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from fl.choices import unknown_name
from simbase.errors import AisimError


@dataclasses.dataclass(frozen=True)
class Source:
    """A data set's public source: its archive's URL, the files the loader reads (relative to
    the data set's cache folder), the citation and the terms of use."""

    url: str
    files: tuple[str, ...]
    citation: str
    licence: str


SOURCES = {
    "femnist": Source(
        "https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2",
        ("fed_emnist_train.h5", "fed_emnist_test.h5"),
        "EMNIST (Cohen et al. 2017) by writer, as TensorFlow Federated publishes it (3,400 "
        "writers, 62 classes); LEAF's FEMNIST (Caldas et al. 2018) is the same split",
        "NIST Special Database 19's terms (NIST); TFF's files under Apache-2.0",
    ),
    "cifar10": Source(
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        tuple(f"cifar-10-batches-py/{f}" for f in ("batches.meta", "test_batch"))
        + tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
        "Krizhevsky (2009), Learning Multiple Layers of Features from Tiny Images",
        "the CIFAR page's terms (cite the report)",
    ),
    "cifar100": Source(
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        tuple(f"cifar-100-python/{f}" for f in ("meta", "train", "test")),
        "Krizhevsky (2009), Learning Multiple Layers of Features from Tiny Images",
        "the CIFAR page's terms (cite the report)",
    ),
    "stackoverflow": Source(
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.tar.bz2",
        ("stackoverflow_train.h5", "stackoverflow_test.h5", "stackoverflow.word_count"),
        "Stack Overflow by user, as TensorFlow Federated publishes it (342,477 train users; "
        "Reddi et al. 2021's next-word task); the word counts come from "
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2",
        "CC BY-SA 3.0 (Stack Exchange data dump)",
    ),
    "sent140": Source(
        "http://cs.stanford.edu/people/alecmgo/trainingandtestdata.zip",
        ("training.1600000.processed.noemoticon.csv",),
        "Sentiment140 (Go, Bhayani & Huang 2009), by Twitter user as in LEAF (Caldas et al. 2018)",
        "the Sentiment140 authors' terms (academic use, cite the paper)",
    ),
}
EXTRA_ARCHIVES = {  # further archives a data set needs, unpacked into the same folder
    "stackoverflow": (
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2",
    ),
}


def cache_dir(data_dir: str | Path | None) -> Path:
    """The cache root: ``data_dir``, else ``$AISIM_DATA``, else ``~/.cache/aisim/fl``."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get("AISIM_DATA")
    return Path(env) if env else Path.home() / ".cache" / "aisim" / "fl"


def _fetch(url: str, into: Path) -> None:
    """Downloads ``url`` and unpacks it into ``into`` (tar or zip)."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into) as tmp:
        archive = Path(tmp) / url.rsplit("/", 1)[-1]
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(archive, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            raise AisimError(f"{url}: download failed ({e})", usage=False) from None
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                z.extractall(into)
        else:
            with tarfile.open(archive) as t:
                t.extractall(into, filter="data")


def local_files(name: str, data_dir: str | Path | None, download: bool) -> Path:
    """The folder holding data set ``name``'s files (see module)."""
    if name not in SOURCES:
        raise unknown_name("dataset", name, SOURCES, "data set")
    src = SOURCES[name]
    folder = cache_dir(data_dir) / name
    missing = [f for f in src.files if not (folder / f).is_file()]
    if missing and download:
        for url in (src.url, *EXTRA_ARCHIVES.get(name, ())):
            _fetch(url, folder)
        missing = [f for f in src.files if not (folder / f).is_file()]
    if missing:
        raise AisimError(
            field="data_dir",
            value=str(folder),
            expected=f"{name}'s files ({', '.join(missing[:2])}{', ...' if len(missing) > 2 else ''})",
            hint=f"pass {{download}} to fetch them from {src.url}",
            usage=False,
        )
    return folder
