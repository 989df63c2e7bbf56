"""sessionroute.bench."""
