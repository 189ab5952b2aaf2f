from turnlog.interface.cli import entrypoint

entrypoint()
