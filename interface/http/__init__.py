"""The HTTP API (FastAPI): ``create_app`` builds it; ``turnlog serve`` runs it."""

from turnlog.interface.http.app import create_app

__all__ = ["create_app"]
