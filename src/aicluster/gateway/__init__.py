"""The inference data plane: OpenAI-compatible routes in front of service replicas."""
