"""Memory layout planning for static subgraphs (ED-Batch style): a PQ tree and the planner."""
from .pqtree import PQTree

__all__ = ["PQTree"]
