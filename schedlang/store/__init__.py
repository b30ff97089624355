"""The tuning database (SQLite) and what can be read back from a damaged one."""
