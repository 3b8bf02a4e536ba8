"""The ``foldline`` command line."""
