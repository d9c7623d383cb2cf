"""The local federation demo: the four phases of the Borealis poster on real agents and Spark."""
