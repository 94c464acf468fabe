"""Generated from protos/microco/api/common."""
