"""Every registered op has reference cases; case ids are unique and name real ops."""
from __future__ import annotations

from allcases import ALL
from opcases import variants

from dynagraph.ops import OPS

# Leaves bound to parameter storage: exercised by every case through their users.
LEAVES = {"parameter", "lookup_table"}


def _covered(cases) -> set:
    return {c.op for c in cases} | {t for c in cases for t in c.tags}


def test_every_op_has_a_reference_case():
    missing = set(OPS) - LEAVES - _covered(ALL)
    assert not missing, f"ops without a test case: {sorted(missing)}"


def test_every_op_has_a_batched_case():
    missing = set(OPS) - LEAVES - _covered([c for c in ALL if c.batch])
    assert not missing, f"ops without a batched-equivalence case: {sorted(missing)}"


def test_every_op_with_tensor_arguments_is_batched_with_a_shared_parameter():
    # A lookup table is itself a parameter shared by every node of the batch.
    shared = _covered([c for c in ALL if c.batch and (any(v.startswith("shared") for v in variants(c))
                                                     or any(a.kind == "table" for a in c.args))])
    no_tensor_args = {n for n in OPS if all(not c.args for c in ALL if c.op == n)}
    missing = set(OPS) - LEAVES - no_tensor_args - shared
    assert not missing, f"ops never batched with a shared-parameter argument: {sorted(missing)}"


def test_case_ids_unique_and_ops_exist():
    ids = [c.id for c in ALL]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    unknown = _covered(ALL) - set(OPS)
    assert not unknown, f"cases name unknown ops: {sorted(unknown)}"
