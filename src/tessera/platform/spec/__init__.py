"""The run spec: its schema, loading and validation, MCLI's YAML and edits of a submitted run's spec."""
