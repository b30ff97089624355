"""The HTML report of a tuning database (`schedlang report`)."""
