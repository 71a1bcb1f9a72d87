"""The client axis sharded over 4 (virtual) devices gives the unsharded result."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, jax
    from fl.config import ExperimentConfig
    from fl.simulation import build, simulate
    assert len(jax.devices()) == 4, jax.devices()
    base = dict(dataset="digits", clients=40, clients_per_round=12, rounds=3, local_epochs=2,
                lr=0.05, partition="dirichlet", devices="server", stragglers=0.3,
                algorithm="scaffold", memory_budget="6MB")
    out = {}
    for shard in (True, False):
        b = build(ExperimentConfig(**base, shard=shard))
        out[f"chunk_{shard}"] = b.spec.chunk
        out[f"mesh_{shard}"] = b.spec.mesh is not None
        m = simulate(ExperimentConfig(**base, shard=shard)).metrics
        out[str(shard)] = m.to_dict(orient="list")
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_sharded_equals_unsharded():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["mesh_True"] and not out["mesh_False"]
    assert out["chunk_True"] % 4 == 0 and out["chunk_True"] < 12  # several chunks, sharded
    sharded, plain = out["True"], out["False"]
    assert sharded["clients_kept"] == plain["clients_kept"]
    for col in ("train_loss", "test_loss", "test_accuracy", "sim_time_s"):
        for a, b in zip(sharded[col], plain[col], strict=True):
            assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (col, a, b)
