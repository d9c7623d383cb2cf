"""A query whose module has no input generator (`bpm_app.bench.workload.generator` refuses it)."""

from bpm.query import Query

query = Query(name="bare", schema="ts TIMESTAMP, k STRING", key="k", event_time="ts", lateness=0,
              compute=lambda events, params: events, result_key=("k",), result_time="ts")
