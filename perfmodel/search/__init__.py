"""Many strategies: enumerate a grid with numpy, evaluate it in one ``jit(vmap)``
(:func:`perfmodel.search.evaluate.evaluate_grid`), reduce it on the device (top-k, best per
point, Pareto) and rank sweeps over models, hardware and stacks."""
