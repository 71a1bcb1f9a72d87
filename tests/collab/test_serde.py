"""collab.serialisation: the protobuf codec against hand-encoded bytes, every format's round trip,
the benchmark's rows and throughputs, and the scenario parser's errors as data."""

from __future__ import annotations

import numpy as np
import pytest

import collab
from collab import parse_sizes, scenario_from_text
from collab import serialisation as serde
from collab.settings import parse_rates
from simbase.errors import AisimError


@pytest.mark.parametrize(
    "n, wire", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02")]
)
def test_varint_matches_the_protobuf_spec(n, wire):
    assert serde.encode_varint(n) == wire
    assert serde.decode_varint(wire, 0) == (n, len(wire))


def test_proto_bytes_of_one_tensor_by_hand():
    tree = {"w": np.array([[1.0, 2.0]], np.float32)}
    data = np.array([1.0, 2.0], "<f4").tobytes()
    tensor = b"\x0a\x01w" + b"\x12\x02\x01\x02" + b"\x1a\x08" + data
    assert serde.proto_dumps(tree) == b"\x0a" + bytes([len(tensor)]) + tensor


@pytest.mark.parametrize("fmt", list(serde.FORMATS))
def test_every_format_round_trips(fmt):
    tree = serde.params_tree(1000, layers=3) | {"odd": np.arange(6, dtype=np.float32).reshape(2, 3)}
    codec = serde.FORMATS[fmt]
    back = codec.loads(codec.dumps(tree))
    assert set(back) == set(tree)
    for k in tree:
        assert back[k].dtype == np.float32 and np.array_equal(back[k], tree[k])


def test_truncated_proto_is_an_error():
    blob = serde.proto_dumps({"w": np.ones((300,), np.float32)})
    with pytest.raises(AisimError, match="truncated"):
        serde.proto_loads(blob[:2])


def test_measure_serde_rows_and_throughputs():
    rows = serde.measure_serde(["1k", "2k"], ["pickle", "protobuf"], repeats=1)
    assert [(r.model_params, r.format) for r in rows] == [
        ("1k", "pickle"),
        ("1k", "protobuf"),
        ("2k", "pickle"),
        ("2k", "protobuf"),
    ]
    r = rows[0]
    assert r.params == 8 * round(np.sqrt(1000 / 8)) ** 2 and r.bytes == 4 * r.params
    assert set(r.to_dict()) == {
        "format",
        "model_params",
        "params",
        "bytes",
        "serialize_s",
        "deserialize_s",
        "serialize_gb_per_s",
        "deserialize_gb_per_s",
    }
    thr = serde.serde_throughputs(rows)
    assert list(thr) == ["pickle", "protobuf"]
    pk = [x for x in rows if x.format == "pickle"]
    assert thr["pickle"]["serialize_bytes_per_s"] == pytest.approx(
        sum(x.bytes for x in pk) / sum(x.serialize_s for x in pk)
    )


@pytest.mark.parametrize(
    "call, field, value",
    [
        (lambda: serde.measure_serde(["1k"], ["json"], 1), "formats", "json"),
        (lambda: serde.measure_serde(["1k"], ["pickle"], 0), "repeats", 0),
        (lambda: parse_sizes("10Q"), "sizes", "10Q"),
        (lambda: parse_rates("0Gbps", "wan_bandwidth"), "wan_bandwidth", "0Gbps"),
        (lambda: scenario_from_text(clients=3, devices="1,2"), "devices", "1,2"),
        (lambda: scenario_from_text(wan_up="fast"), "wan_up", "fast"),
        (lambda: collab.make_setup("gossip"), "mode", "gossip"),
        (lambda: collab.make_setup(topk_fraction=2.0), "topk_fraction", 2.0),
        (lambda: collab.make_setup(num_microbatches=0), "num_microbatches", 0),
    ],
)
def test_library_errors_carry_data_not_flags(call, field, value):
    with pytest.raises(AisimError) as e:
        call()
    assert (e.value.source, e.value.field, e.value.value) == (None, field, value)
    assert "--" not in str(e.value)


def test_public_api_names_exist_and_profiles_round_trip(tmp_path):
    import json

    from collab.profile import apply_profile, serde_profile

    assert all(hasattr(collab, n) for n in collab.__all__)
    rows = serde.measure_serde(["1k"], ["pickle"], repeats=1)
    doc = serde_profile(serde.serde_throughputs(rows), [r.to_dict() for r in rows])
    path = tmp_path / "serde.json"
    path.write_text(json.dumps(doc))
    sc = scenario_from_text(serde_format="pickle")
    out = apply_profile(sc, path, "pickle")
    assert out.serialize_bytes_per_s == doc["collab"]["serde"]["pickle"]["serialize_bytes_per_s"]
    with pytest.raises(AisimError) as e:
        apply_profile(sc, path, "numpy")
    assert (e.value.source, e.value.field, e.value.value) == (str(path), "collab.serde", "numpy")
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "collab"}))
    with pytest.raises(AisimError, match="no 'collab' block") as e:
        apply_profile(sc, path)
    assert "aisim collab" not in str(e.value)
