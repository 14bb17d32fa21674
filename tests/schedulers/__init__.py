"""Scheduler tests: invariance of values/gradients and structural checks of schedules."""
