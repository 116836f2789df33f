"""A stored trial's compressed model exported in a format a serving stack loads without pareto: the
artifact, the check that loads it back in a fresh process, and the manifest."""
