"""Scheduler-comparison workloads: per-sample DyNet-style models on deterministic synthetic data.

Every workload is a class with the same small interface:

    w = WORKLOADS["treelstm"](hidden=32, seed=0)   # parameters in w.pc
    xs = w.instances(32, seed=1)                   # deterministic synthetic samples
    loss = w.record(xs)                            # records into the current graph, returns the summed loss
    cg = w.graph(xs, scheduler="agenda")           # renew_cg(scheduler) + record; loss in w.last_loss

Trees (synthetic SST-like bracketings): treelstm, treegru, treelstm2type, mvrnn.
Chains: bilstm (tagger), encdec (LSTM encoder-decoder).
Lattices (character chains plus 2..8-character word arcs): latticelstm, latticegru;
nerlattice: the lattice tagger over the real NER lattices (shared/data/lattice).
"""
from __future__ import annotations

from .base import Workload
from .lattices import LatticeGRU, LatticeLSTM, NERLattice
from .sequences import BiLSTMTagger, EncoderDecoder
from .trees import MVRNN, TreeGRU, TreeLSTM, TreeLSTM2Type

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (
    TreeLSTM, TreeGRU, TreeLSTM2Type, MVRNN, BiLSTMTagger, EncoderDecoder, LatticeLSTM, LatticeGRU, NERLattice)}

__all__ = ["Workload", "WORKLOADS"] + [w.__name__ for w in WORKLOADS.values()]
