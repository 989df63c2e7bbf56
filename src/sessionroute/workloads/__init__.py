"""sessionroute.workloads."""
