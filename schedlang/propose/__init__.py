"""Proposers: the interface the tuner reads, and the built-in template writer."""
