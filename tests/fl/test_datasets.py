"""Each data-set loader reads its real format: small files in that format (tests/fl/data,
written by make_fixtures.py) checked against the format's own statistics; the user's arrays with
one clear error per bad input; Flower Datasets through its interface; no network."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

from fl.datasets import from_arrays, from_flwr, from_leaf, load_field, load_path
from fl.datasets.field import so_sentence_ids, tweet_ids
from fl.datasets.sources import SOURCES, local_files
from fl.models import make_model
from simbase.errors import AisimError

DATA = Path(__file__).parent / "data"


def test_leaf_json_partition_matches_its_num_samples():
    ds = from_leaf(DATA / "leaf_femnist")
    doc = json.loads((DATA / "leaf_femnist/train/all_data_0.json").read_text())
    test = json.loads((DATA / "leaf_femnist/test/all_data_0.json").read_text())
    assert ds.client_names == tuple(doc["users"])
    np.testing.assert_array_equal(ds.population.sizes, doc["num_samples"])
    assert ds.input_shape == (784,) and len(ds.y_test) == sum(test["num_samples"])
    # client 1's rows are that writer's samples, in order
    rows = ds.population.client_rows(1)
    np.testing.assert_allclose(ds.x_train[rows], doc["user_data"]["f0001_41"]["x"], atol=1e-6)
    np.testing.assert_array_equal(ds.y_train[rows], doc["user_data"]["f0001_41"]["y"])


def test_leaf_user_whose_num_samples_disagrees_is_one_error(tmp_path):
    doc = {"users": ["u"], "num_samples": [3], "user_data": {"u": {"x": [[0.0]], "y": [1]}}}
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "d.json").write_text(json.dumps(doc))
    with pytest.raises(AisimError, match="user_data.u.*num_samples = 3"):
        from_leaf(tmp_path)


def test_tff_femnist_clients_are_the_files_writers():
    ds = load_field("femnist", data_dir=DATA, num_clients=100)
    with h5py.File(DATA / "femnist/fed_emnist_train.h5") as f:
        writers = sorted(f["examples"])
        sizes = [len(f["examples"][w]["label"]) for w in writers]
        first = f["examples"][writers[0]]["pixels"][()]
    with h5py.File(DATA / "femnist/fed_emnist_test.h5") as f:
        n_test = sum(len(f["examples"][w]["label"]) for w in f["examples"])
    assert ds.client_names == tuple(writers) and ds.num_classes == 62
    np.testing.assert_array_equal(ds.population.sizes, sizes)
    assert ds.input_shape == (28, 28) and len(ds.y_test) == n_test
    np.testing.assert_array_equal(ds.x_train[ds.population.client_rows(0)], first)


def test_cifar10_pickles_and_dirichlet_skew():
    ds = load_field("cifar10", data_dir=DATA, num_clients=4, partition="dirichlet", seed=0)
    root = DATA / "cifar10/cifar-10-batches-py"
    meta = pickle.loads((root / "batches.meta").read_bytes())
    per_batch = meta[b"num_cases_per_batch"]
    assert len(ds.y_train) == 5 * per_batch and len(ds.y_test) == per_batch
    assert ds.num_classes == len(meta[b"label_names"]) == 10
    batch = pickle.loads((root / "data_batch_1").read_bytes(), encoding="bytes")
    # the pickle's channel-major row 0 is the image's red plane, in [0, 1]
    np.testing.assert_allclose(
        ds.x_train[0][..., 0].reshape(-1), batch[b"data"][0][:1024] / 255.0, rtol=1e-6
    )
    assert ds.input_shape == (32, 32, 3) and ds.population.sizes.sum() == len(ds.y_train)
    assert sorted(np.concatenate([ds.population.client_rows(k) for k in range(4)])) == list(
        range(len(ds.y_train))
    )


def test_cifar100_fine_labels():
    ds = load_field("cifar100", data_dir=DATA, num_clients=2, partition="iid")
    train = pickle.loads((DATA / "cifar100/cifar-100-python/train").read_bytes(), encoding="bytes")
    assert ds.num_classes == 100
    assert sorted(ds.y_train.tolist()) == sorted(train[b"fine_labels"])


def test_stackoverflow_sentences_become_shifted_word_ids():
    ds = load_field("stackoverflow", data_dir=DATA, num_clients=10)
    with h5py.File(DATA / "stackoverflow/stackoverflow_train.h5") as f:
        users = sorted(f["examples"])
        sizes = [len(f["examples"][u]["tokens"]) for u in users]
        first = f["examples"][users[0]]["tokens"][0].decode()
    np.testing.assert_array_equal(ds.population.sizes, sizes)
    words = (DATA / "stackoverflow/stackoverflow.word_count").read_text().split()[::2]
    vocab = {w: i + 1 for i, w in enumerate(words)}
    x, y = so_sentence_ids(first, vocab)
    np.testing.assert_array_equal(ds.x_train[0], x)
    v = len(vocab)
    # by hand: bos, the words (unknown -> v + 1), eos, padding; y is x shifted by one
    ids = [vocab.get(w, v + 1) for w in first.split()][:20]
    seq = ([v + 2, *ids, v + 3] + [0] * 21)[:21]
    assert x == seq[:-1] and y == seq[1:]
    assert ds.num_classes == ds.vocab_size == v + 4 and ds.y_train.shape[1:] == (20,)


def test_sent140_users_with_enough_tweets():
    ds = load_field("sent140", data_dir=DATA, num_clients=10)
    # alice 12 and carol 10 tweets reach LEAF's 10; bob 3 and dave 1 do not
    assert ds.client_names == ("alice", "carol") and ds.num_classes == 2
    assert ds.population.sizes.sum() + len(ds.y_test) == 22
    assert tweet_ids("So good!", {"so": 2, "good": 3}, 4) == [0, 0, 2, 3]


def test_missing_field_data_says_how_to_get_it(tmp_path):
    with pytest.raises(AisimError) as e:
        local_files("cifar10", tmp_path, download=False)
    assert e.value.field == "data_dir" and SOURCES["cifar10"].url in str(e.value)
    assert all(s.licence and s.citation for s in SOURCES.values())


def test_npz_arrays_with_client_ids(tmp_path):
    rng = np.random.default_rng(0)
    ids = np.array(["b", "a", "b", "c", "a", "b"])
    np.savez(
        tmp_path / "d.npz",
        x=rng.random((6, 3)),
        y=np.array([0, 1, 2, 0, 1, 2]),
        client_id=ids,
        x_test=rng.random((2, 3)),
        y_test=np.array([1, 2]),
    )
    ds = load_path(str(tmp_path / "d.npz"))
    assert ds.client_names == ("b", "a", "c")
    np.testing.assert_array_equal(ds.population.sizes, [3, 2, 1])
    np.testing.assert_array_equal(ds.y_train[ds.population.client_rows(0)], [0, 2, 2])
    assert ds.num_classes == 3 and len(ds.y_test) == 2


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(x=[np.zeros(3), np.zeros(4)], y=[0, 1], client_ids=[0, 1]), "sample 1 of shape (4,)"),
        (
            dict(x=np.zeros((2, 3)), y=[0, 5], client_ids=[0, 1], num_classes=3),
            "= 5: expected a label in 0..2",
        ),
        (
            dict(x=np.zeros((2, 3)), y=[0, 1], client_ids=[0, 0], clients=[0, 1]),
            "'client_id' = 1: expected a client with at least one example",
        ),
        (dict(x=np.zeros((2, 3)), y=[0, 1, 1], client_ids=[0, 0]), "'y' = '3 rows'"),
    ],
)
def test_bad_arrays_are_one_clear_error(kw, needle):
    with pytest.raises(AisimError) as e:
        from_arrays(where="d.npz", **kw)
    assert needle in str(e.value) and str(e.value).startswith("d.npz: ")


class FakePartition:
    """A Hugging Face ``Dataset``'s interface: column names and column access."""

    def __init__(self, cols):
        self.cols = cols
        self.column_names = list(cols)

    def __getitem__(self, key):
        return self.cols[key]


class FakePartitioner:
    """flwr-datasets' partitioner interface: ``num_partitions`` and ``load_partition``."""

    def __init__(self, parts):
        self.parts = parts
        self.num_partitions = len(parts)

    def load_partition(self, i):
        return self.parts[i]


def test_flower_partitions_become_clients():
    rng = np.random.default_rng(0)
    parts = [
        FakePartition(
            {
                "img": [rng.integers(0, 256, (4, 4, 3), dtype=np.uint8) for _ in range(n)],
                "label": list(rng.integers(0, 10, n)),
            }
        )
        for n in (3, 5, 2)
    ]
    test = FakePartition({"img": parts[0]["img"][:2], "label": [1, 2]})
    ds = from_flwr(FakePartitioner(parts), test=test, num_classes=10)
    np.testing.assert_array_equal(ds.population.sizes, [3, 5, 2])
    np.testing.assert_allclose(ds.x_train[3], parts[1]["img"][0] / 255.0, rtol=1e-6)
    assert len(ds.y_test) == 2
    # without a test split, each client of two or more samples holds one out (10 %, at least 1)
    held = from_flwr(FakePartitioner(parts), num_classes=10)
    np.testing.assert_array_equal(held.population.sizes, [2, 4, 1])
    with pytest.raises(AisimError, match="column.*'image'.*one of img, label"):
        from_flwr(FakePartitioner(parts), x_key="image")


@pytest.mark.slow
def test_field_models_have_their_published_sizes():
    # Reddi et al. 2021, table 6 (appendix): EMNIST CNN 1,690,046; Stack Overflow NWP 4,050,748
    assert make_model("cnn", (28, 28), 62).num_params == 1_690_046
    so = make_model("so-lstm", (20,), 10_004)
    assert so.num_params == 4_050_748 and so.task.name == "next-token"
    # ResNet-18 (11.17 M with a 10-class head); group norm has the same affine parameters as BN
    assert make_model("resnet18-gn", (32, 32, 3), 10).num_params == 11_173_962


def test_download_fetches_unpacks_and_caches_once(tmp_path, monkeypatch):
    """--download on a file:// URL (no network): the archive is fetched into the cache and
    unpacked, and a second load reads the cache without fetching."""
    import dataclasses
    import tarfile

    from fl.datasets import sources

    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(DATA / "cifar10" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    src = dataclasses.replace(SOURCES["cifar10"], url=archive.as_uri())
    monkeypatch.setitem(sources.SOURCES, "cifar10", src)
    cache = tmp_path / "cache"
    folder = local_files("cifar10", cache, download=True)
    assert folder == cache / "cifar10" and all((folder / f).is_file() for f in src.files)
    archive.unlink()  # cached: no second fetch
    assert local_files("cifar10", cache, download=True) == folder
    ds = load_field("cifar10", data_dir=cache, num_clients=2, partition="iid")
    assert len(ds.y_train) == 40 and len(ds.y_test) == 8
