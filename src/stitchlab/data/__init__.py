"""Data sets. ``synthetic`` needs no files: procedurally generated images."""

from .synthetic import shapes

__all__ = ["shapes"]
