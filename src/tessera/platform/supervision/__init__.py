"""Keeping runs alive: the supervisor loop, submission, retries, failure classes, GPU health."""
