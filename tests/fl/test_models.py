"""The dense layers' small-batch kernel gradient against ``lax.dot_general`` (values and grads)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl.models import OUTER_PRODUCT_MAX_ROWS, cross_entropy, dense_dot_general, make_model

DN = (((1,), (0,)), ((), ()))


@pytest.mark.parametrize("rows", [1, 3, 10, OUTER_PRODUCT_MAX_ROWS, OUTER_PRODUCT_MAX_ROWS + 1])
def test_dense_dot_general_equals_lax_in_value_and_gradient(rows):
    kx, kw, kg = jax.random.split(jax.random.key(rows), 3)
    x, w = jax.random.normal(kx, (rows, 7)), jax.random.normal(kw, (7, 5))
    g = jax.random.normal(kg, (rows, 5))

    def loss(dot):
        return lambda x, w: jnp.sum(dot(x, w, DN) * g)

    np.testing.assert_allclose(
        dense_dot_general(x, w, DN), jax.lax.dot_general(x, w, DN), rtol=1e-6
    )
    got = jax.grad(loss(dense_dot_general), argnums=(0, 1))(x, w)
    want = jax.grad(loss(jax.lax.dot_general), argnums=(0, 1))(x, w)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # By hand: d/dw sum((x w) * g) = x^T g.
    np.testing.assert_allclose(got[1], np.asarray(x).T @ np.asarray(g), rtol=1e-5, atol=1e-5)


def test_vmapped_kernel_gradient_equals_per_client_loop():
    # The round vmaps the gradient over clients: the same per-client values as a loop.
    clients, rows = 6, 10
    kx, kw = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(kx, (clients, rows, 4)), jax.random.normal(kw, (clients, 4, 3))

    def grad_w(x, w):
        return jax.grad(lambda w: jnp.sum(jnp.tanh(dense_dot_general(x, w, DN))))(w)

    batched = jax.jit(jax.vmap(grad_w))(x, w)
    for c in range(clients):
        np.testing.assert_allclose(batched[c], grad_w(x[c], w[c]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
@pytest.mark.slow
def test_models_train_like_plain_flax_dense(name):
    # outer_product_grad=False is flax's own Dense: the same parameters, loss and gradient.
    fast = make_model(name, (16,), 10, hidden=(16, 16))
    plain = make_model(name, (16,), 10, hidden=(16, 16), outer_product_grad=False)
    params = fast.init(jax.random.key(1))
    assert jax.tree.structure(params) == jax.tree.structure(plain.init(jax.random.key(1)))
    x = jax.random.normal(jax.random.key(2), (10, 16))
    y, mask = jnp.arange(10) % 10, jnp.ones(10)

    def grad_fn(model):
        return jax.grad(lambda p: cross_entropy(model.apply(p, x), y, mask))

    # Only the outer-product gradient multiplies kernel-shaped outer products (flax's is one dot).
    kernels = [k.shape for k in jax.tree.leaves(params) if k.ndim == 2]
    assert len(kernels) == {"logreg": 1, "mlp": 3, "cnn": 2}[name]
    for fn, outer in ((grad_fn(fast), True), (grad_fn(plain), False)):
        jaxpr = str(jax.make_jaxpr(fn)(params))
        for a, b in kernels:
            assert (f"f32[{a},{b}] = mul" in jaxpr) == outer
    got, want = jax.jit(grad_fn(fast))(params), jax.jit(grad_fn(plain))(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


# the built-in models the CLI's data sets train (resnet18-gn's default compile alone takes 6 s)
INIT_SHAPES = {
    "logreg": ((60,), 10),
    "mlp": ((64,), 10),
    "cnn": ((784,), 62),
    "lstm": ((80,), 80),
    "simple-cnn": ((32, 32, 3), 10),
    "text-lstm": ((25,), 2),
}


# the convolutional and recurrent models compile for seconds each, twice: the full suite only
HEAVY = {"cnn", "lstm", "simple-cnn", "text-lstm"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow if n in HEAVY else ()) for n in sorted(INIT_SHAPES)],
)
def test_init_compiled_for_one_run_gives_the_default_compiles_bits(name):
    # Model.init compiles with LLVM -O1 (it runs once); XLA's default -O2 must give the same bits.
    shape, outputs = INIT_SHAPES[name]
    model = make_model(name, shape, outputs)
    key = jax.random.key(3)
    got = model.init(key)
    want = jax.jit(model.init.__wrapped__)(key)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
