"""Benchmarks behind `bpm bench ...`: each measures and returns a JSON-ready dict."""
