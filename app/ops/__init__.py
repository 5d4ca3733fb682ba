"""The process: the gunicorn edge worker, start-up checks and the first start, the
background housekeeper and the operators' CLI. Typed against the storage interface
(app/storage/interface.py), never a backend."""
