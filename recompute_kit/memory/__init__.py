"""Measurement (and, later, estimation) of activation memory."""
