"""Stand-ins for tests and offline trials (a tiny language model built offline)."""
