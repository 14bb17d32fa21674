"""Batching schedulers, chosen by name. See base.py for the protocol."""
from .base import Scheduler, available, get, lower_bound, register, validate  # noqa: F401
from . import simple  # noqa: F401
from . import typewise, fsm  # noqa: F401  (registers "typewise" and "fsm")
from . import merge  # noqa: F401,E402  (the batch-merging post-pass: "NAME+merge")
