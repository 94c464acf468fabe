"""Generated from protos/microco/api/scheduler."""
