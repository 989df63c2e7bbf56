"""Subcommands of the ``sessionroute`` CLI, one module each (see :mod:`sessionroute.cli`)."""
