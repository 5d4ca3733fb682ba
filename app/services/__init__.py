"""Use cases over the storage interface, without Flask: the memory tool's commands and the
usage report. The API and the CLI call them; they call app/storage/interface.py."""
