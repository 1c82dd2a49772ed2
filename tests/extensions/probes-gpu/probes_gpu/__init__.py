from ._C import add_one

__all__ = ["add_one"]
