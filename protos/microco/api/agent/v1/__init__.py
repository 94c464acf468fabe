"""Generated from protos/microco/api/agent/v1."""
