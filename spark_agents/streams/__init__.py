"""A participant's input stream: the feeder that writes any query's records to it."""
