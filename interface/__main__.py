from interface.cli import entrypoint

entrypoint()
