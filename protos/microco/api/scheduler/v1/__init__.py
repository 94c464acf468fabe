"""Generated from protos/microco/api/scheduler/v1."""
