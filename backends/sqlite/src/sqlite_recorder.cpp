// Implemented by the SQLite backend work.
