"""Generated from protos/microco/api."""
