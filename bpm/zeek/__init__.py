"""Zeek `conn.log` input: parsing, a traffic generator and the plain reference computation.

The modules here have no Spark dependency: the Spark query in `spark_agents.query`
implements the same definitions, and tests compare the two.
"""
