"""The live federation's pure side: registry records turned into the mechanism's views, and
the reconciliation of what a participant runs with what the registry says it hosts."""
