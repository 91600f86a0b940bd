"""Generated stubs for the proto package toolgate.v1 (scripts/generate.py; do not edit them)."""
