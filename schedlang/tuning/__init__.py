"""The knob search, its cost model, tuning curves."""
