"""The MCP tools (``/mcp``, app/api/mcp.py): the tool table and what each tool does.

``tools`` holds the table and runs a call; ``arguments`` checks a call's arguments,
``artifacts`` record_turn's and read_artifact's artifacts, ``text`` bounds what a result
shows. The changes go through the use cases (app/services/tasks.py, stores.py), which check
access and record the audit events; the tools record none of their own.
"""
