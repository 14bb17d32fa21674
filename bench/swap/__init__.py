"""DyNet programs for bench/import_swap.py: ONE text per workload, written as DyNet's examples are.

Every module here starts with ``import dynet as dy``. The import-swap worker puts either
DyNet or dynagraph into ``sys.modules['dynet']`` before importing a program, so both
systems run exactly this text. Weights come from numpy arrays (`parameters_from_numpy`,
`lookup_parameters_from_numpy`, and `set_value` for a builder's own parameters), drawn
from the same seeded generator in both processes.

Each program defines ``Model(pc, H, vocab, n_out, rng)`` with ``loss(sample)``; mini-batched
programs also define ``begin()`` (the per-graph `dy.parameter` calls).
"""
