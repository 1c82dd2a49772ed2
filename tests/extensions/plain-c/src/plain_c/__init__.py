from ._native import twice

__all__ = ["twice"]
