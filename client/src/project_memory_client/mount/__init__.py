"""``project-memory mount``: keep local directories in sync with memory stores of a server.

Plain Python over HTTP (httpx). See docs/mounting.md.
"""
