"""Fusion in three separately tested steps: predicates -> regions -> outline, plus the cost model."""
