"""Generated from protos/microco/api/cache/v1."""
