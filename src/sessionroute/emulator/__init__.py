"""sessionroute.emulator."""
