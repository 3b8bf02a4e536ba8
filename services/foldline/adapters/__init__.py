"""Adapters for the ports. Pick them through :mod:`foldline.config`, not by importing here."""
