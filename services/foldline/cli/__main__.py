"""``python -m foldline.cli``: the ``foldline`` command."""

from .main import main

main()
