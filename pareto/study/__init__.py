"""A study: the search loop, the bench it measures on, one configuration assessed, the claim on a
configuration, confirmation, samplers, Optuna's study, local workers and the search's result."""
