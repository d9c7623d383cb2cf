"""Alembic migrations of the registry database (the same scripts build SQLite and PostgreSQL)."""
