"""Serialisation of model parameters: four wire formats and a benchmark of their throughput.

Contract: :data:`FORMATS` maps a format name (``numpy``, ``msgpack``, ``protobuf``, ``pickle``) to
a :class:`Codec` whose ``dumps`` turns a ``{name: float32 array}`` tree into bytes and whose
``loads`` gives the same tree back. :func:`proto_dumps` / :func:`proto_loads` are a dependency-free
codec of the protobuf wire format. :func:`measure_serde` times each format on the standard square
MLP's weights (:func:`params_tree`) and returns one :class:`SerdeMeasurement` per (size, format);
:func:`serde_throughputs` reduces them to the per-format throughputs that
:func:`collab.profile.serde_profile` writes and :mod:`collab` reads.
Bad arguments raise :class:`~simbase.errors.AisimError` naming the argument (``sizes``,
``formats``, ``repeats``); the caller maps them to its own names.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import statistics
import time
from collections.abc import Callable, Iterable

import numpy as np

from simbase import units
from simbase.errors import AisimError, bad_value

Tree = dict[str, np.ndarray]


# --------------------------------------------------------------------- protobuf wire format


def encode_varint(n: int) -> bytes:
    """A non-negative integer as a protobuf base-128 varint (7 bits per byte, low bits first)."""
    if n < 0:
        raise bad_value(None, "n", n, "a non-negative integer")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint starting at ``buf[pos]`` and the position just after it."""
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise AisimError("protobuf: truncated varint", usage=False)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2): tag, length, payload."""
    return encode_varint(field_number << 3 | 2) + encode_varint(len(payload)) + payload


def proto_dumps(tree: Tree) -> bytes:
    """Protobuf wire format of ``message Params { repeated Tensor tensor = 1; }`` with
    ``message Tensor { string name = 1; repeated uint64 shape = 2 [packed]; bytes data = 3; }``
    (``data``: the float32 values, little-endian, C order)."""
    parts = []
    for name, a in tree.items():
        a = np.ascontiguousarray(a, np.float32)
        shape = b"".join(encode_varint(d) for d in a.shape)
        msg = (
            _length_delimited(1, name.encode())
            + _length_delimited(2, shape)
            + _length_delimited(3, a.astype("<f4", copy=False).tobytes())
        )
        parts.append(_length_delimited(1, msg))
    return b"".join(parts)


def proto_loads(blob: bytes) -> Tree:
    """Inverse of :func:`proto_dumps` (fields in any order; unknown field numbers are skipped)."""
    buf = memoryview(blob)
    out, pos = {}, 0
    while pos < len(buf):
        _, pos = decode_varint(buf, pos)  # tag of field 1
        length, pos = decode_varint(buf, pos)
        end, name, shape, data = pos + length, "", (), b""
        while pos < end:
            tag, pos = decode_varint(buf, pos)
            n, pos = decode_varint(buf, pos)
            field = buf[pos : pos + n]
            pos += n
            if tag >> 3 == 1:
                name = bytes(field).decode()
            elif tag >> 3 == 2:
                dims, p = [], 0
                while p < n:
                    d, p = decode_varint(field, p)
                    dims.append(d)
                shape = tuple(dims)
            elif tag >> 3 == 3:
                data = field
        out[name] = np.frombuffer(data, "<f4").astype(np.float32).reshape(shape)
    return out


# --------------------------------------------------------------------- the four formats


def _numpy_dumps(tree: Tree) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **tree)
    return buf.getvalue()


def _numpy_loads(blob: bytes) -> Tree:
    with np.load(io.BytesIO(blob)) as z:
        return {k: z[k] for k in z.files}


def _msgpack_dumps(tree: Tree) -> bytes:
    from flax import serialization

    return serialization.msgpack_serialize(tree)


def _msgpack_loads(blob: bytes) -> Tree:
    from flax import serialization

    return serialization.msgpack_restore(blob)


@dataclasses.dataclass(frozen=True)
class Codec:
    """A wire format: ``dumps(tree) -> bytes`` and ``loads(bytes) -> tree``."""

    dumps: Callable[[Tree], bytes]
    loads: Callable[[bytes], Tree]


FORMATS: dict[str, Codec] = {
    "numpy": Codec(_numpy_dumps, _numpy_loads),
    "msgpack": Codec(_msgpack_dumps, _msgpack_loads),
    "protobuf": Codec(proto_dumps, proto_loads),
    "pickle": Codec(lambda t: pickle.dumps(t, protocol=5), pickle.loads),
}


def check_formats(formats: Iterable[str]) -> list[str]:
    """The formats as a list, or an error naming ``formats`` and the first unknown one."""
    out = list(formats)
    for f in out:
        if f not in FORMATS:
            raise bad_value(None, "formats", f, "formats among " + ", ".join(FORMATS))
    return out


# --------------------------------------------------------------------- the benchmark


def params_tree(n_params: float, layers: int = 8) -> Tree:
    """The standard square MLP's weights: ``layers`` h x h float32 kernels with
    ``h = round(sqrt(n_params / layers))``, drawn from a fixed seed (deterministic)."""
    h = max(1, round(math.sqrt(n_params / layers)))
    rng = np.random.default_rng(0)
    return {f"layer{i}": rng.standard_normal((h, h), dtype=np.float32) for i in range(layers)}


@dataclasses.dataclass(frozen=True)
class SerdeMeasurement:
    """Median (de)serialisation time of one model size in one format (seconds, bytes)."""

    format: str
    model_params: str
    params: int
    bytes: int
    serialize_s: float
    deserialize_s: float

    @property
    def serialize_gb_per_s(self) -> float:
        return self.bytes / self.serialize_s / units.GIGA

    @property
    def deserialize_gb_per_s(self) -> float:
        return self.bytes / self.deserialize_s / units.GIGA

    def to_dict(self) -> dict:
        """The row as printed and written: the fields plus both throughputs in GB/s."""
        return dataclasses.asdict(self) | {
            "serialize_gb_per_s": self.serialize_gb_per_s,
            "deserialize_gb_per_s": self.deserialize_gb_per_s,
        }


def _time_round_trip(codec: Codec, tree: Tree, repeats: int) -> tuple[float, float, Tree]:
    """Median seconds of ``dumps`` and of ``loads`` over ``repeats`` runs, and the last tree back."""
    ts, td = [], []
    back = tree
    for _ in range(repeats):
        t0 = time.perf_counter()
        blob = codec.dumps(tree)
        t1 = time.perf_counter()
        back = codec.loads(blob)
        t2 = time.perf_counter()
        ts.append(t1 - t0)
        td.append(t2 - t1)
    return statistics.median(ts), statistics.median(td), back


def measure_serde(
    sizes: Iterable[str], formats: Iterable[str], repeats: int
) -> list[SerdeMeasurement]:
    """Times serialise and deserialise of each size's float32 weights in each format.

    Args:
      sizes: model sizes as parameter counts (``"10M"``; see :func:`params_tree`).
      formats: names in :data:`FORMATS`.
      repeats: timings per (size, format); the median is kept.

    Returns:
      One :class:`SerdeMeasurement` per (size, format), sizes outermost.

    Raises:
      AisimError: an unknown format or size, ``repeats < 1`` (usage), or a format whose round
        trip changed the parameters (not usage).
    """
    formats = check_formats(formats)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise bad_value(None, "repeats", repeats, "a positive integer")
    rows = []
    for size in sizes:
        try:
            n = units.parse_count(size)
        except ValueError:
            raise bad_value(None, "sizes", size, "parameter counts like 10M,100M or 1.5B") from None
        tree = params_tree(n)
        for fmt in formats:
            ser_s, deser_s, back = _time_round_trip(FORMATS[fmt], tree, repeats)
            if not all(np.array_equal(back[k], tree[k]) for k in tree):
                raise AisimError(f"{fmt}: the round trip changed the parameters", usage=False)
            del back
            rows.append(
                SerdeMeasurement(
                    format=fmt,
                    model_params=str(size),
                    params=int(sum(a.size for a in tree.values())),
                    bytes=int(sum(a.nbytes for a in tree.values())),
                    serialize_s=ser_s,
                    deserialize_s=deser_s,
                )
            )
    return rows


def serde_throughputs(rows: Iterable[SerdeMeasurement]) -> dict[str, dict[str, float]]:
    """Per format, total bytes over total median time of all its sizes (bytes per second):
    ``{format: {"serialize_bytes_per_s": ..., "deserialize_bytes_per_s": ...}}``, in the order
    the formats first appear."""
    rows = list(rows)
    out = {}
    for fmt in dict.fromkeys(r.format for r in rows):
        rs = [r for r in rows if r.format == fmt]
        total = sum(r.bytes for r in rs)
        out[fmt] = {
            "serialize_bytes_per_s": total / sum(r.serialize_s for r in rs),
            "deserialize_bytes_per_s": total / sum(r.deserialize_s for r in rs),
        }
    return out
