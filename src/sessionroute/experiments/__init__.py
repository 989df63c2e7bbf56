"""sessionroute.experiments."""
