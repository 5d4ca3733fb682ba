"""The MCP tools (``/mcp``, app/api/mcp.py): the tool table and what each tool does.

``tools`` holds the table and runs a call; ``arguments`` checks a call's arguments,
``artifacts`` record_turn's and read_artifact's artifacts, ``text`` bounds what a result
shows.
"""
