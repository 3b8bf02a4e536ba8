"""foldline: agent loops whose every model request is rebuilt, byte for byte, from the session log."""

__version__ = "0.1.0"
__all__ = ["__version__"]
