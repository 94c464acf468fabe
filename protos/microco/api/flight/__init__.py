"""Generated from protos/microco/api/flight."""
