"""Queries written against the query API (`bpm.query`) only, each with a small input generator.

`network_monitoring`: connection and port alerts per source over Zeek connection records;
`sensors`: average and maximum per device per tumbling window; `sessions`: click sessions
per user (session windows: a query whose tasks move but do not split).
"""
