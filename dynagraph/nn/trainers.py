"""Trainers with DyNet's update rules (being written)."""
__all__: list = []
