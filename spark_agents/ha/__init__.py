"""High availability of moved tasks on the Spark data plane: output fence, delta checkpoints,
stream acknowledgements, heartbeats, and the roles of each mode (docs/ha.md)."""

from spark_agents.ha.delta import Applied, Delta, DeltaRefused, DeltaShipper, apply_delta, checkpoint_cut
from spark_agents.ha.fence import FencedError, FencedSink, FenceState
from spark_agents.ha.heartbeat import HeartbeatReceiver, HeartbeatSender, HeartbeatWatcher, silent
from spark_agents.ha.roles import (
    PassiveBackup,
    PrimaryDuties,
    Takeover,
    consumer_name,
    start_primary,
    start_replica,
    take_over,
)
from spark_agents.ha.upstream import oldest_open_window_us, processed_ack_seq, replay_seq

__all__ = [
    "Applied", "Delta", "DeltaRefused", "DeltaShipper", "FenceState", "FencedError", "FencedSink", "HeartbeatReceiver",
    "HeartbeatSender", "HeartbeatWatcher", "PassiveBackup", "PrimaryDuties", "Takeover", "apply_delta", "checkpoint_cut",
    "consumer_name", "oldest_open_window_us", "processed_ack_seq", "silent", "start_primary",
    "replay_seq", "start_replica", "take_over",
]
