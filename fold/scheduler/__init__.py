"""The scheduler: host walk, node recording and index arrays."""

# The public names are re-exported by fold/__init__.py; these modules are imported by path.
__all__: list[str] = []
