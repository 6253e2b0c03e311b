"""The scheduler: host walk, node recording and index arrays."""
