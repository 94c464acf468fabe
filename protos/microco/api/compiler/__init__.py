"""Generated from protos/microco/api/compiler."""
