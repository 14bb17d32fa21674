"""RNN builders with DyNet's parameter layout (being written)."""
__all__: list = []
