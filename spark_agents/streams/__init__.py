"""The rows of a participant's input stream, and the feeder that writes them."""

from spark_agents.streams.records import MARK_DATA, MARK_END, MARK_TICK, StreamRecord

__all__ = ["MARK_DATA", "MARK_END", "MARK_TICK", "StreamRecord"]
