"""Channel-last convolutions (fl.convlayout): the same values, and only Eigen-ready convolutions
in a loop body on XLA:CPU (jax-ml/jax#12868)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from fl import local_update as lu
from fl.convlayout import canonical_conv, canonical_convs, cpu_canonical_convs
from fl.models import make_model

RNG = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(RNG.normal(size=shape).astype(np.float32))


@pytest.mark.parametrize(
    "lhs_shape,rhs_shape,dn,kw",
    [
        ((2, 3, 9, 8), (4, 3, 3, 3), ("NCHW", "OIHW", "NCHW"), {}),
        ((2, 9, 8, 3), (3, 3, 3, 4), ("NHWC", "HWIO", "NHWC"), {"window_strides": (2, 1)}),
        ((2, 9, 8, 4), (3, 2, 2, 6), ("NHWC", "HWIO", "NHWC"), {"feature_group_count": 2}),
        ((4, 9, 8, 3), (3, 3, 3, 6), ("NHWC", "HWIO", "NHWC"), {"batch_group_count": 2}),
        ((3, 2, 10), (2, 4, 3), ("NCH", "IOH", "NHC"), {"lhs_dilation": (2,)}),
        ((9, 8, 2, 3), (3, 3, 3, 4), ("HWNC", "HWIO", "CNHW"), {"rhs_dilation": (2, 1)}),
    ],
)
def test_canonical_conv_equals_lax(lhs_shape, rhs_shape, dn, kw):
    lhs, rhs = _normal(*lhs_shape), _normal(*rhs_shape)
    kw = {"window_strides": (1,) * (len(lhs_shape) - 2), "padding": "SAME", **kw}
    if "lhs_dilation" in kw:
        kw["padding"] = [(1, 1)]
    want = lax.conv_general_dilated(lhs, rhs, dimension_numbers=dn, **kw)

    def traced(a, b):  # canonical_convs hands canonical_conv the primitive's own parameters
        return lax.conv_general_dilated(a, b, dimension_numbers=dn, **kw)

    got = jax.jit(canonical_convs(traced))(lhs, rhs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    eqn = jax.make_jaxpr(traced)(lhs, rhs).jaxpr.eqns[-1]
    direct = canonical_conv(lhs, rhs, **eqn.params)
    np.testing.assert_allclose(direct, want, rtol=1e-5, atol=1e-5)


def _cnn_step():
    model = make_model("cnn", (12, 12, 1), 4)
    params = model.init(jax.random.key(0))
    x, y = _normal(6, 12, 12, 1), jnp.arange(6) % 4

    def loss(p, x):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    return params, x, jax.value_and_grad(loss)


@pytest.mark.slow
def test_gradient_of_a_cnn_is_unchanged_and_jit_calls_are_inlined():
    params, x, vg = _cnn_step()
    (l0, g0), (l1, g1) = jax.jit(vg)(params, x), jax.jit(canonical_convs(vg))(params, x)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # a convolution inside a jit call is rewritten as well (the call is inlined)
    jitted = canonical_convs(jax.jit(vg))
    eqns = jax.make_jaxpr(jitted)(params, x).eqns
    labels = {
        e.params["dimension_numbers"] for e in eqns if e.primitive.name == "conv_general_dilated"
    }
    assert labels == {lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))}
    # vmapped over clients with their own parameters (grouped convolutions)
    ps = jax.tree.map(lambda a: jnp.stack([a, 0.5 * a]), params)
    xs = jnp.stack([x, -x])
    want = jax.jit(jax.vmap(vg))(ps, xs)
    got = jax.jit(jax.vmap(canonical_convs(vg)))(ps, xs)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _conv_labels(hlo: str) -> list[str]:
    return re.findall(r" convolution\(.*?dim_labels=([^,\s]+)", hlo)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU pass")
@pytest.mark.slow  # compiles a CNN training loop
def test_loop_body_has_only_channel_last_convolutions_on_cpu():
    params, x, vg = _cnn_step()

    def loop(grad_fn):
        def body(p, _):
            _, g = grad_fn(p, x)
            return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), None

        return lambda p: lax.scan(body, p, None, length=2)[0]

    plain = _conv_labels(jax.jit(loop(vg)).lower(params).compile().as_text())
    fixed = _conv_labels(jax.jit(loop(cpu_canonical_convs(vg))).lower(params).compile().as_text())
    assert len(plain) == len(fixed) >= 3
    assert any(lab != "b01f_01io->b01f" for lab in plain)  # the slow elemental form (#12868)
    assert all(lab == "b01f_01io->b01f" for lab in fixed)


def test_model_without_convolutions_compiles_to_the_same_program():
    model = make_model("mlp", (20,), 5, hidden=(16,))
    params = model.init(jax.random.key(0))
    x = _normal(8, 20)

    def vg(p):
        return jax.value_and_grad(lambda q: jnp.sum(model.apply(q, x) ** 2))(p)

    def text(f):
        return jax.jit(f).lower(params).as_text()

    assert text(canonical_convs(vg)) == text(vg)


@pytest.mark.slow
def test_looped_local_update_equals_unrolled_steps_on_a_conv_model():
    """``local_update`` (``lax.scan`` over steps) against the same steps unrolled in the entry
    computation, where XLA:CPU canonicalises convolutions itself."""
    model = make_model("cnn", (12, 12, 1), 4)
    n, bsz, steps = 24, 6, 5
    x, y = _normal(n, 12, 12, 1), jnp.asarray(RNG.integers(0, 4, n).astype(np.int32))
    spec = lu.LocalSpec(model.apply, optax.sgd(0.1), bsz, n, 2)
    data = lu.LocalData(x, y)
    g = model.init(jax.random.key(1))
    task = lu.ClientTask(
        start=jnp.int32(0),
        n=jnp.int32(n),
        steps=jnp.int32(steps),
        key=jax.random.key(2),
        correction=jax.tree.map(jnp.zeros_like, g),
    )
    mu = jnp.float32(0.0)
    looped = jax.jit(lu.local_update, static_argnums=(0, 5))(spec, task, g, mu, data, steps)

    @jax.jit
    def unrolled(task, g):
        table = lu.shuffle_table(lu.shuffle_keys(task.key, spec.max_epochs), task.n)
        st = lu.init_state(spec, g)
        for s in range(steps):
            st = lu.client_step(spec, st, jnp.int32(s), task, table, g, mu, data)
        return st

    ref = unrolled(task, g)
    assert int(looped.steps_done) == steps
    np.testing.assert_allclose(looped.loss_sum, ref.loss_sum, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(looped.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
