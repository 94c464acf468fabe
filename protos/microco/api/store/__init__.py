"""Generated from protos/microco/api/store."""
