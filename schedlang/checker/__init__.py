"""The checker: every statement guarded and applied to a live schedule, every problem in one pass,
then the whole kernel as TVM lowers it; the lowering pipeline.
"""
