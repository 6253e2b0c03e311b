"""Types, blocks and layers."""
