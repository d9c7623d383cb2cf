"""Each participant's broker: its NATS server, its input stream in JetStream, and the Spark source that reads it."""
