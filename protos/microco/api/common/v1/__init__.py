"""Generated from protos/microco/api/common/v1."""
