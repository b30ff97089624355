"""Learning from the tuning database: its records as a dataset, and models trained on it."""
