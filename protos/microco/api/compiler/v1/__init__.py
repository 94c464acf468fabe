"""Generated from protos/microco/api/compiler/v1."""
