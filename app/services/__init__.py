"""Use cases over the storage interface, in plain Python: no Flask, no request."""
