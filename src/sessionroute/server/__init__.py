"""sessionroute.server."""
