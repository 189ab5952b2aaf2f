"""The operator console: server-rendered pages under ``/console`` in the API's own app.

Sessions, a session's live timeline with the operator's actions on an
interrupted turn, and a status board. Jinja2 templates, one small script,
one stylesheet; no build step. See ``routes`` for how no data is served
without the API token.
"""

from turnlog.interface.console.routes import install

__all__ = ["install"]
