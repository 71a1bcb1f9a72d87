"""Questions about one run: estimate one strategy, time, cost and energy to train, what limits
it (sensitivities) and how sure the answer is (prediction intervals)."""
