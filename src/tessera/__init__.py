"""Tessera: train models on any compute, anywhere, with data and checkpoints in object storage."""

__version__ = "0.1.0"
