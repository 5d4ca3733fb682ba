"""``project-memory mcp``: the server's MCP tools over stdio, for clients that speak only stdio."""
