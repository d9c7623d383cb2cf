"""The agent's side that touches Spark: the monitoring query as movable tasks, the task host,
its measurements and the HTTP status it serves.

Importing this package does not import PySpark; the modules that need it import it themselves.
"""
