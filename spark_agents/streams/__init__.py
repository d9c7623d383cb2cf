"""The replayable, partitioned input stream that tasks read, and the feeder that writes it."""

from spark_agents.streams.partitioned import PartitionedStream, StreamError, StreamRecord, positions_glob, stream_path

__all__ = ["PartitionedStream", "StreamError", "StreamRecord", "positions_glob", "stream_path"]
