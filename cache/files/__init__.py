"""Files, vector stores and their chunk index (``file_search``): the embedded backend (SQLite) and
the shared one (Postgres with pgvector) behind the interfaces of ``cache.files.index``."""
