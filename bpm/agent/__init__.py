"""A participant's side of the mechanism as a state machine (`bpm.agent.machine`), driven by
the live agent and by the simulator alike."""
