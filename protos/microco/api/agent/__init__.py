"""Generated from protos/microco/api/agent."""
