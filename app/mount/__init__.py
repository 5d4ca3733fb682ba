"""``project-memory mount``: keep local directories in sync with memory stores of a server.

Plain Python over HTTP (``requests``); no Flask. See docs/mounting.md.
"""
