"""Storage: plain Python, no Flask, behind one interface (interface.py).

``core/`` is what every backend shares (the errors, the models, ``Scope``, the clock, the
rules of names and records), ``tree/`` the filesystem backend, ``pg/`` PostgreSQL with an
object store, and ``backends.py`` builds the configured one. Callers import each name from
the module that defines it; importing ``app.storage`` itself imports nothing, so a command
that needs only ``core`` loads no backend and none of the server's dependencies.
"""
