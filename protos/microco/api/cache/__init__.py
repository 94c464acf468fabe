"""Generated from protos/microco/api/cache."""
