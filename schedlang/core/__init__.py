"""The leaves: the one Diagnostic type, targets and their hardware limits as data, op files."""
