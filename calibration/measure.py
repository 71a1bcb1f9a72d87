"""Time real flax training steps on the JAX devices at hand and return measurement rows.

Contract: :func:`measure_many` builds each model (a GPT-like transformer or a square bias-free
ReLU MLP, DistIR's shape), lays it out on a ``Mesh(('dp', 'tp'))`` -- the batch sharded over
``dp``, the weights Megatron-style over ``tp`` (column-parallel then row-parallel, via
``NamedSharding``; XLA's SPMD partitioner inserts the collectives) -- runs ``warmup`` steps
(compilation included), then times ``steps`` more one by one with ``block_until_ready``, in
``rounds`` round-robin passes over the configurations. A step is forward, backward and an optax
Adam update. The rows use the measurement CSV schema; ``step_time_s`` is the median step (or the
minimum, ``statistic="min"``), ``throughput_samples_per_s`` = global batch / that time, and each
row records the host it ran on (``platform``, ``device_kind``, ``host_devices``, ``host_cores``).
This is the imperative shell: it prints nothing and writes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import statistics
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from simbase.errors import AisimError, bad_value
from simbase.parse import check_seed
from simbase.xla_options import fast_cpu_options

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
# device_kind substrings -> hardware preset, most specific first.
_DEVICE_PRESETS = (
    ("h200", "h200"), ("h100", "h100-sxm"), ("b200", "b200"), ("a100-sxm4-40gb", "a100-40gb"),
    ("a100-pcie-40gb", "a100-40gb"), ("a100", "a100-80gb"), ("v100", "v100-32gb"),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Shape:
    """The model actually trained: a transformer or a square MLP (``kind``)."""

    kind: str  # "transformer" | "mlp"
    num_layers: int
    hidden_size: int
    num_heads: int = 0
    num_kv_heads: int = 0
    ffn_hidden_size: int = 0
    seq_len: int = 0
    vocab_size: int = 0
    gated_mlp: bool = False
    bias: bool = True
    tied_embeddings: bool = True
    learned_pos_emb: bool = True


@dataclasses.dataclass(frozen=True)
class Config:
    """One measured configuration."""

    dp: int
    tp: int
    global_batch_size: int


# ------------------------------------------------------------------------------------ models


class _Block(nn.Module):
    shape: Shape
    dtype: Any

    @nn.compact
    def __call__(self, x):
        s, dt = self.shape, self.dtype
        head = s.hidden_size // s.num_heads
        h = nn.LayerNorm(dtype=dt, name="ln1")(x)
        q = nn.Dense(s.num_heads * head, use_bias=s.bias, dtype=dt, name="q_col")(h)
        kv = nn.Dense(2 * s.num_kv_heads * head, use_bias=s.bias, dtype=dt, name="kv_col")(h)
        b, t = x.shape[0], x.shape[1]
        q = q.reshape(b, t, s.num_heads, head)
        k, v = jnp.split(kv.reshape(b, t, 2 * s.num_kv_heads, head), 2, axis=2)
        if s.num_kv_heads != s.num_heads:  # grouped-query attention
            k = jnp.repeat(k, s.num_heads // s.num_kv_heads, axis=2)
            v = jnp.repeat(v, s.num_heads // s.num_kv_heads, axis=2)
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, -1)
        x = x + nn.Dense(s.hidden_size, use_bias=s.bias, dtype=dt, name="o_row")(a)
        h = nn.LayerNorm(dtype=dt, name="ln2")(x)
        if s.gated_mlp:
            gate = nn.Dense(s.ffn_hidden_size, use_bias=False, dtype=dt, name="gate_col")(h)
            up = nn.Dense(s.ffn_hidden_size, use_bias=False, dtype=dt, name="up_col")(h)
            h = jax.nn.silu(gate) * up
        else:
            h = nn.gelu(nn.Dense(s.ffn_hidden_size, use_bias=s.bias, dtype=dt, name="up_col")(h))
        return x + nn.Dense(s.hidden_size, use_bias=s.bias, dtype=dt, name="down_row")(h)


class GPT(nn.Module):
    """A pre-LayerNorm GPT: token (+ learned position) embeddings, blocks, LM head."""

    shape: Shape
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        s = self.shape
        embed = nn.Embed(s.vocab_size, s.hidden_size, dtype=self.dtype, name="wte_vocab")
        x = embed(tokens)
        if s.learned_pos_emb:
            x = x + nn.Embed(s.seq_len, s.hidden_size, dtype=self.dtype, name="wpe")(
                jnp.arange(tokens.shape[1])
            )
        for i in range(s.num_layers):
            x = _Block(s, self.dtype, name=f"block{i}")(x)
        x = nn.LayerNorm(dtype=self.dtype, name="ln_f")(x)
        if s.tied_embeddings:
            return embed.attend(x)
        return nn.Dense(s.vocab_size, use_bias=False, dtype=self.dtype, name="head_col")(x)


class SquareMLP(nn.Module):
    """``num_layers`` bias-free ``h × h`` layers with ReLU between them (DistIR's mlp)."""

    shape: Shape
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        n = self.shape.num_layers
        for i in range(n):
            # Megatron pairs: even layers split their outputs over tp, odd layers their inputs.
            name = f"dense{i}_{'col' if i % 2 == 0 else 'row'}"
            x = nn.Dense(self.shape.hidden_size, use_bias=False, dtype=self.dtype, name=name)(x)
            if i < n - 1:
                x = nn.relu(x)
        return x


def _spec_for(path: tuple, leaf, tp: int) -> P:
    """Megatron layout from the parameter's name: *_col split outputs, *_row inputs."""
    names = [getattr(k, "key", str(k)) for k in path]
    owner = next((n for n in reversed(names) if n.endswith(("_col", "_row", "_vocab"))), "")
    if tp == 1 or leaf.ndim == 0:
        return P()
    if owner.endswith("_col"):
        return P(None, "tp") if leaf.ndim == 2 else P("tp")
    if owner.endswith("_row") and leaf.ndim == 2:
        return P("tp", None)
    if owner.endswith("_vocab") and leaf.ndim == 2:
        return P("tp", None)  # vocab-parallel embedding
    return P()


# ------------------------------------------------------------------------------------ runner


def hardware_for_devices(devices: list[jax.Device], hardware: str | None) -> str:
    """``hardware`` if given, 'cpu-host' on CPU, else the preset named by the device kind."""
    if hardware:
        return hardware
    if devices[0].platform == "cpu":
        return "cpu-host"
    kind = devices[0].device_kind.lower().replace(" ", "-")
    for needle, preset in _DEVICE_PRESETS:
        if needle in kind:
            return preset
    raise AisimError(
        field="hardware",
        expected=f"a hardware preset: device kind {devices[0].device_kind!r} has none",
        hint="pass {hardware}",
    )


def check_config(shape: Shape, cfg: Config, n_devices: int) -> None:
    """Raises a usage error for a configuration that cannot run on ``n_devices``.

    Raises:
      AisimError: ``field`` ``dp``, ``global_batch_size`` or the model dimension (``hidden_size``,
        ``num_heads``, ``num_kv_heads``, ``ffn_hidden_size``, ``vocab_size``) that does not fit.
    """
    used = cfg.dp * cfg.tp
    if used > n_devices or n_devices % used:
        raise bad_value(
            None,
            "dp",
            cfg.dp,
            f"dp·tp = {cfg.dp}·{cfg.tp} = {used}: a divisor of the {n_devices} JAX devices",
            hint="on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N",
        )
    if cfg.global_batch_size % cfg.dp:
        raise bad_value(
            None, "global_batch_size", cfg.global_batch_size, f"a multiple of dp={cfg.dp}"
        )
    if cfg.tp > 1:
        dims = {"hidden_size": shape.hidden_size}
        if shape.kind == "transformer":
            dims.update(num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                        ffn_hidden_size=shape.ffn_hidden_size, vocab_size=shape.vocab_size)  # fmt: skip
        for name, value in dims.items():
            if value % cfg.tp:
                raise bad_value(None, name, value, f"a multiple of tp={cfg.tp}")


STATISTICS = ("median", "min")


@dataclasses.dataclass
class _Run:
    """One configuration, compiled and placed, ready to be timed (mutable: the training state)."""

    cfg: Config
    step: Any
    state: tuple
    inputs: Any
    targets: Any
    num_params: int
    times: list[float] = dataclasses.field(default_factory=list)

    def time(self, n: int, keep: bool = True) -> None:
        """Runs ``n`` steps one by one, each timed to ``block_until_ready``."""
        params, opt_state, loss = self.state
        for _ in range(n):
            t0 = time.perf_counter()
            params, opt_state, loss = self.step(params, opt_state, self.inputs, self.targets)
            jax.block_until_ready((params, opt_state, loss))
            if keep:
                self.times.append(time.perf_counter() - t0)
        self.state = (params, opt_state, loss)


def _prepare(shape: Shape, cfg: Config, dtype: str, seed: int, devices: list[jax.Device]) -> _Run:
    """Builds the model, its sharded state and the jitted step of one configuration."""
    check_config(shape, cfg, len(devices))
    mesh = Mesh(np.array(devices[: cfg.dp * cfg.tp]).reshape(cfg.dp, cfg.tp), ("dp", "tp"))
    compute = COMPUTE_DTYPES[dtype]
    rng = np.random.default_rng(seed)
    if shape.kind == "transformer":
        model = GPT(shape, compute)
        x = rng.integers(0, shape.vocab_size, (cfg.global_batch_size, shape.seq_len + 1))
        inputs, targets = jnp.asarray(x[:, :-1], jnp.int32), jnp.asarray(x[:, 1:], jnp.int32)

        def loss_fn(params, inputs, targets):
            logits = model.apply({"params": params}, inputs).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    else:
        model = SquareMLP(shape, compute)
        inputs = jnp.asarray(rng.standard_normal((cfg.global_batch_size, shape.hidden_size)),
                             jnp.float32)  # fmt: skip
        targets = jnp.asarray(rng.standard_normal((cfg.global_batch_size, shape.hidden_size)),
                              jnp.float32)  # fmt: skip

        def loss_fn(params, inputs, targets):
            out = model.apply({"params": params}, inputs.astype(compute)).astype(jnp.float32)
            return jnp.mean((out - targets) ** 2)

    tx = optax.adam(1e-4)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(seed), inputs[:1])["params"])
    param_sh = jax.tree_util.tree_map_with_path(
        lambda p, leaf: NamedSharding(mesh, _spec_for(p, leaf, cfg.tp)), abstract
    )
    data_sh = NamedSharding(mesh, P("dp"))
    # the initialisations run once: compiled for a fast start (the step keeps XLA's defaults:
    # it is what is measured)
    once = fast_cpu_options()
    params = jax.jit(lambda: model.init(jax.random.key(seed), inputs[:1])["params"],
                     out_shardings=param_sh, compiler_options=once)()  # fmt: skip
    opt_state = jax.jit(tx.init, compiler_options=once)(params)
    replicated = NamedSharding(mesh, P())
    opt_sh = jax.tree.map(
        lambda leaf: leaf.sharding if isinstance(leaf.sharding, NamedSharding) else replicated,
        opt_state,
    )
    opt_state = jax.device_put(opt_state, opt_sh)
    inputs, targets = jax.device_put(inputs, data_sh), jax.device_put(targets, data_sh)

    def train_step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # Fixed in/out layouts: the step's outputs feed the next call without a recompile.
    step = jax.jit(
        train_step,
        in_shardings=(param_sh, opt_sh, data_sh, data_sh),
        out_shardings=(param_sh, opt_sh, replicated),
        donate_argnums=(0, 1),
    )
    num_params = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract))
    return _Run(cfg=cfg, step=step, state=(params, opt_state, jnp.zeros(())), inputs=inputs,
                targets=targets, num_params=num_params)  # fmt: skip


def _row(run: _Run, steps: int, warmup: int, rounds: int, dtype: str, statistic: str,
         devices: list[jax.Device]) -> dict[str, Any]:  # fmt: skip
    cfg, times = run.cfg, run.times
    loss = float(run.state[2])
    if not math.isfinite(loss):
        raise AisimError(
            f"dp={cfg.dp} tp={cfg.tp}: the loss became {loss}",
            field="final_loss",
            value=loss,
            expected="a finite loss",
            usage=False,
        )
    chosen = min(times) if statistic == "min" else float(statistics.median(times))
    return dict(
        num_gpus=cfg.dp * cfg.tp, dp=cfg.dp, tp=cfg.tp, pp=1,
        global_batch_size=cfg.global_batch_size, micro_batch_size=cfg.global_batch_size // cfg.dp,
        num_microbatches=1, recompute="none", sequence_parallel=False, zero_stage=0, dtype=dtype,
        step_time_s=chosen, throughput_samples_per_s=cfg.global_batch_size / chosen,
        statistic=statistic, step_time_median_s=float(statistics.median(times)),
        step_time_min_s=min(times), step_time_max_s=max(times), steps=steps, rounds=rounds,
        warmup=warmup, num_params=run.num_params, final_loss=loss,
        device_kind=devices[0].device_kind, platform=devices[0].platform,
        host_devices=len(devices), host_cores=os.cpu_count(),
        date=datetime.date.today().isoformat(), jax_version=jax.__version__,
    )  # fmt: skip


def measure_many(
    jobs: list[tuple[Shape, Config]], *, steps: int, warmup: int, rounds: int = 1,
    statistic: str = "median", dtype: str = "fp32", seed: int = 0,
    devices: list[jax.Device] | None = None, on_done=None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Times every (shape, configuration) job; returns their rows, in order.

    With ``rounds == 1`` each job is built, warmed up, timed for ``steps`` steps and released
    before the next. With ``rounds > 1`` every job is built and warmed up first (all stay in
    memory), then timed ``steps`` steps at a time, round-robin, ``rounds`` times: on a host
    shared with other work, a burst of contention then spreads over all the configurations
    instead of spoiling one. ``step_time_s`` is the ``statistic`` (``median``, or ``min``: the
    least disturbed step, the better estimate of the intrinsic time on a shared host) of the
    ``steps · rounds`` timed steps. ``on_done(i)`` is called after each job's last round.
    """
    if statistic not in STATISTICS:
        raise bad_value(None, "statistic", statistic, "one of " + ", ".join(STATISTICS))
    check_seed(seed)
    devices = list(devices or jax.devices())
    for shape, cfg in jobs:
        check_config(shape, cfg, len(devices))
    rows: list[dict[str, Any] | None] = [None] * len(jobs)
    if rounds <= 1:
        for i, (shape, cfg) in enumerate(jobs):
            run = _prepare(shape, cfg, dtype, seed, devices)
            run.time(warmup, keep=False)
            run.time(steps)
            rows[i] = _row(run, steps, warmup, 1, dtype, statistic, devices)
            if on_done:
                on_done(i)
        return rows  # type: ignore[return-value]
    runs = []
    for shape, cfg in jobs:
        run = _prepare(shape, cfg, dtype, seed, devices)
        run.time(warmup, keep=False)
        runs.append(run)
    for r in range(rounds):
        for i, run in enumerate(runs):
            run.time(steps)
            if r == rounds - 1:
                rows[i] = _row(run, steps, warmup, rounds, dtype, statistic, devices)
                if on_done:
                    on_done(i)
    return rows  # type: ignore[return-value]


def measure_one(
    shape: Shape, cfg: Config, *, steps: int, warmup: int, dtype: str = "fp32", seed: int = 0,
    devices: list[jax.Device] | None = None, statistic: str = "median",
) -> dict[str, Any]:  # fmt: skip
    """Times ``steps`` training steps of one configuration; returns the row's measured fields."""
    return measure_many([(shape, cfg)], steps=steps, warmup=warmup, statistic=statistic,
                        dtype=dtype, seed=seed, devices=devices)[0]  # fmt: skip


def shape_columns(model: str, shape: Shape) -> dict[str, Any]:
    """The model columns of a row: preset name (or 'custom') and the dimensions used."""
    cols: dict[str, Any] = dict(model=model, model_kind=shape.kind, num_layers=shape.num_layers,
                                hidden_size=shape.hidden_size)  # fmt: skip
    if shape.kind == "transformer":
        cols.update(num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                    ffn_hidden_size=shape.ffn_hidden_size, seq_len=shape.seq_len,
                    vocab_size=shape.vocab_size)  # fmt: skip
    else:
        cols.update(input_size=shape.hidden_size, output_size=shape.hidden_size)
    return cols
