"""Generated from proto/lac/v1 by scripts/gen_proto.py; do not edit."""
