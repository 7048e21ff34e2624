"""What runs on nodes (the agent and its workers) and the wire protocol to reach it."""
