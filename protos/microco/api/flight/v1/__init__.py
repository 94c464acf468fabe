"""Generated from protos/microco/api/flight/v1."""
