"""The application: the `bpm` command line, the demo and the benchmarks, built on the domain
(`bpm`), the registry (`api`) and the agents (`spark_agents`)."""
