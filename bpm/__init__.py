"""Federated load management for Spark streaming: the Bounded-Price Mechanism and its HA layer."""

__version__ = "0.1.0"
