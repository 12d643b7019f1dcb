"""The state store provider under Spark's operators: equivalence, restarts, executors, TTL,
options."""
