"""WSGI entry point: ``gunicorn wsgi:app`` or ``flask --app wsgi ...``.

A bad MEMORY_* setting stops either with one line on stderr and exit status 2. An admin
command (``flask --app wsgi tokens list``) gets the app without its routes, which it never
serves, and without the imports behind them (app.ops.startup.admin_command).
"""

import os
import sys

from app.ops.startup import admin_command, checked_app

app = checked_app(http=not admin_command(sys.argv, os.environ))
