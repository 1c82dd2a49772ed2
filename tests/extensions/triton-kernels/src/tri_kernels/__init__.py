from ._relu import relu

__all__ = ["relu"]
