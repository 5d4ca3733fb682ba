"""Use cases over the storage interface, without Flask: the memory tool's commands, the
usage report and the MCP tools. The API and the CLI call them; they call
app/storage/interface.py."""
