"""The host layer: worker processes, their identity and retirement, and tensor transport."""
