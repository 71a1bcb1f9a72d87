"""`aisim perf grid`: placeholder until the grid issue lands."""


def grid_command() -> None:
    """Evaluate every strategy (not yet available)."""
