"""WSGI entry point: ``gunicorn wsgi:app`` or ``flask --app wsgi ...``.

A bad MEMORY_* setting stops either with one line on stderr and exit status 2.
"""

from app.ops.startup import checked_app

app = checked_app()
