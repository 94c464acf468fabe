"""Generated from protos/microco/api/store/v1."""
