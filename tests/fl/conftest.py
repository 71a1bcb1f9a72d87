"""Small builders shared by the FL tests (exposed as fixtures; the suite uses importlib mode)."""

import dataclasses

from fl.config import ExperimentConfig
from fl.simulation import build


def small_cfg(**kw) -> ExperimentConfig:
    base = dict(
        dataset="digits",
        clients=40,
        clients_per_round=8,
        rounds=3,
        local_epochs=2,
        batch_size=10,
        lr=0.05,
        partition="dirichlet",
        devices="server",
        checkpoint_every=2,
    )
    base.update(kw)
    return ExperimentConfig(**base)


def built(**kw):
    return build(small_cfg(**kw))


def replace_chunk(b, chunk):
    """The same run with another chunk size (a different memory budget)."""
    import jax

    from fl import round as rnd

    spec = dataclasses.replace(b.spec, chunk=chunk)
    return dataclasses.replace(b, spec=spec, run_round=jax.jit(rnd.make_round(spec)))


import pytest  # noqa: E402


@pytest.fixture
def cfg_factory():
    return small_cfg


@pytest.fixture
def build_factory():
    return built


@pytest.fixture
def rechunk():
    return replace_chunk
