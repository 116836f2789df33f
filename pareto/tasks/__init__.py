"""Built-in tasks, loaded by name through ``pareto.task.BUILTIN_TASKS``."""
