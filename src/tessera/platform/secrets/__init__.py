"""Typed secrets encrypted at rest, how people give them, and the masks that keep them out of output."""
