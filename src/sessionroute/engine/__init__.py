"""sessionroute.engine."""
