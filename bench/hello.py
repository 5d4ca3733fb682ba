"""The framework ceiling: one Flask JSON endpoint, served with the service's gunicorn.conf.py."""

from __future__ import annotations

from flask import Flask

app = Flask(__name__)


@app.get("/hello")
def hello() -> dict[str, str]:
    """Answer a constant JSON object."""
    return {"hello": "world"}
