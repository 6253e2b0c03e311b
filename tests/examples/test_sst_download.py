"""examples/sst.py's download, offline: a zip built from the committed sample, served from a file URL
or a fake opener; checksums, a missing split, no network, and where data_dir looks."""

from __future__ import annotations

import hashlib
import io
import pathlib
import urllib.error
import zipfile

import pytest

from examples import sst

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"
SAMPLE_SUMS = {s: hashlib.sha256((SAMPLE / f"{s}.txt").read_bytes()).hexdigest() for s in sst.SPLITS}


def _zip(path: pathlib.Path, splits=sst.SPLITS) -> pathlib.Path:
    """The release's layout: trees/<split>.txt."""
    with zipfile.ZipFile(path, "w") as z:
        for split in splits:
            z.writestr(f"trees/{split}.txt", (SAMPLE / f"{split}.txt").read_bytes())
    return path


def test_download_from_a_file_url_writes_the_checked_splits(tmp_path):
    archive = _zip(tmp_path / "trees.zip")
    dest = sst.download(tmp_path / "cache", url=archive.as_uri(), checksums=SAMPLE_SUMS, progress=False)
    for split in sst.SPLITS:
        assert (dest / f"{split}.txt").read_bytes() == (SAMPLE / f"{split}.txt").read_bytes()
    assert len(sst.load("dev", dest)) == 200
    assert sorted(p.name for p in dest.iterdir()) == ["dev.txt", "test.txt", "train.txt"]  # no partial files


def test_a_checksum_mismatch_keeps_nothing(tmp_path):
    archive = _zip(tmp_path / "trees.zip")
    with pytest.raises(ValueError, match="train.txt from .* has SHA-256 [0-9a-f]{64}, expected e2f3f41b"):
        sst.download(tmp_path / "cache", url=archive.as_uri(), progress=False)  # the official checksums
    assert not (tmp_path / "cache").exists()


def test_an_archive_without_a_split(tmp_path):
    archive = _zip(tmp_path / "trees.zip", splits=("train", "dev"))
    with pytest.raises(ValueError, match="has no test.txt"):
        sst.download(tmp_path / "cache", url=archive.as_uri(), checksums=SAMPLE_SUMS, progress=False)


def test_no_network_says_what_to_download_and_where(tmp_path):
    def offline(url):
        raise urllib.error.URLError("Temporary failure in name resolution")

    with pytest.raises(RuntimeError, match=r"could not download .* download https://nlp.stanford.edu/sentiment/"
                                           r"trainDevTestTrees_PTB.zip by hand, unzip it and put trees/train.txt, "
                                           r"dev.txt and test.txt in .*cache"):
        sst.download(tmp_path / "cache", opener=offline, progress=False)
    with pytest.raises(RuntimeError, match=r"\(or set FOLD_SST_DIR to the folder\)"):  # a notebook has no flags
        sst.download(tmp_path / "cache", opener=offline, progress=False, pointer="set FOLD_SST_DIR to the folder")


def test_data_dir_downloads_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_DATA", str(tmp_path / "data"))
    assert sst.cache_dir() == tmp_path / "data" / "sst"
    assert sst.data_dir("given") == pathlib.Path("given")
    assert sst.data_dir(None, quick=True) == sst.SAMPLE
    calls = []
    payload = _zip(tmp_path / "trees.zip").read_bytes()

    def opener(url):
        calls.append(url)
        return io.BytesIO(payload)

    real = sst.download
    monkeypatch.setattr(sst, "download", lambda dest, **kw: real(dest, checksums=SAMPLE_SUMS, opener=opener,
                                                                 progress=False, **kw))
    folder = sst.data_dir(None)
    assert folder == tmp_path / "data" / "sst" and len(sst.load("train", folder)) == 640
    assert sst.data_dir(None) == folder and calls == [sst.URL]  # the second call finds the cache
