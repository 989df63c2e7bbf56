"""sessionroute.sim."""
