"""`aisim measure`: placeholder until its issue lands."""


def measure() -> None:
    """Times real JAX training steps (not yet available)."""
