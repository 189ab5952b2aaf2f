"""``python -m turnlog``: the same command line as the ``turnlog`` script."""

from turnlog.interface.cli import entrypoint

entrypoint()
