"""The contract registry: a FastAPI service over SQLAlchemy, plus the admin UI."""
