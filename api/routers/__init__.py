"""HTTP routers of the JSON API, one per domain."""
