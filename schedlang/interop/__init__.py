"""TVM traces and MetaSchedule databases, read back as schedlang."""
