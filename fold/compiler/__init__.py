"""The compiler: type checking, operations, and the executor."""
