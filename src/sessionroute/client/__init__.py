"""sessionroute.client."""
