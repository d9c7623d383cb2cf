"""What the registry, the agents and the command line share over HTTP: the registry's client
(`client`) and the servers' guards against hostile requests (`web`)."""
