"""PQ tree: an exact oracle on small ground sets, fuzzing on large satisfiable ones."""
import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from dynagraph.memory.pqtree import PQTree


def _satisfies(perm, constraints) -> bool:
    pos = {e: i for i, e in enumerate(perm)}
    for S in constraints:
        if S:
            ps = [pos[e] for e in S]
            if max(ps) - min(ps) + 1 != len(S):
                return False
    return True


def _run_oracle(n: int, constraints: list) -> None:
    """After each reduction the tree holds exactly the permutations satisfying all
    accepted constraints; a reduction fails exactly when none would, and then the
    tree is unchanged."""
    tree = PQTree(range(n))
    everything = list(itertools.permutations(range(n)))
    accepted = []
    for S in constraints:
        before = repr(tree)
        expected = {p for p in everything if _satisfies(p, accepted + [S])}
        ok = tree.reduce(S)
        tree.check()
        if expected:
            assert ok, f"{before} reduce {S}"
            accepted.append(S)
            assert set(tree.permutations()) == expected, f"{before} reduce {S} -> {tree}"
            assert tree.count() == len(expected)
            assert all(tree.represents(p) for p in expected)
        else:
            assert not ok and repr(tree) == before


def _random_constraints(rng: random.Random, n: int, k: int) -> list:
    return [set(rng.sample(range(n), rng.randint(0, n))) for _ in range(k)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_exact_oracle_random(n):
    rng = random.Random(n)
    for _ in range(120 if n < 6 else 60):
        _run_oracle(n, _random_constraints(rng, n, rng.randint(1, 6)))


def test_exact_oracle_seven_elements():
    rng = random.Random(7)
    for _ in range(6):
        _run_oracle(7, _random_constraints(rng, 7, 4))


def test_exact_oracle_eight_elements_from_hidden_intervals():
    """Eight elements (40320 permutations): intervals of a hidden order, then a random set."""
    rng = random.Random(8)
    perm = list(range(8))
    rng.shuffle(perm)
    cons = [set(perm[a:a + 3]) for a in (0, 3, 5)] + [set(rng.sample(range(8), 4))]
    _run_oracle(8, cons)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.sets(st.integers(0, n - 1)), min_size=1, max_size=5))))
def test_exact_oracle_hypothesis(case):
    n, constraints = case
    _run_oracle(n, constraints)


@pytest.mark.parametrize("seed", range(6))
def test_hidden_permutation_stays_representable(seed):
    rng = random.Random(seed)
    n = rng.randint(50, 200)
    perm = list(range(n))
    rng.shuffle(perm)
    tree = PQTree(range(n))
    for _ in range(80):
        a = rng.randrange(n)
        b = min(n, a + rng.randint(1, 40))
        assert tree.reduce(perm[a:b])
        assert tree.represents(perm)
        tree.check()
    assert sorted(tree.frontier()) == list(range(n))
    assert tree.represents(tree.frontier())


def test_infeasible_large_reduction_leaves_tree_unchanged():
    tree = PQTree(range(60))
    for k in range(59):
        assert tree.reduce({k, k + 1})  # forces the path order 0..59 (up to reversal)
    before = repr(tree)
    assert tree.count() == 2
    assert not tree.reduce({0, 2})
    assert repr(tree) == before
    assert tree.frontier() in (list(range(60)), list(range(59, -1, -1)))


@pytest.mark.parametrize("seed", range(15))
def test_independent_of_constraint_order(seed):
    rng = random.Random(100 + seed)
    n = rng.randint(3, 6)
    perm = list(range(n))
    rng.shuffle(perm)
    cons = []
    for _ in range(rng.randint(1, 4)):  # satisfiable: intervals of a hidden order
        a = rng.randrange(n)
        cons.append(perm[a:rng.randint(a + 1, n)])
    results = set()
    for _ in range(4):
        rng.shuffle(cons)
        tree = PQTree(range(n))
        assert all(tree.reduce(S) for S in cons)
        results.add(frozenset(tree.permutations()))
    assert len(results) == 1


def test_repr_and_counts():
    tree = PQTree("abcde")
    assert tree.count() == 120
    assert tree.reduce("abc") and tree.reduce("cd")
    assert repr(tree).startswith("PQTree(")
    assert "Q[" in repr(tree) and "P{" in repr(tree)
    # e and the Q-node {a,b}-c-d swap (2) * Q reversal (2) * the free pair {a,b} (2)
    assert tree.count() == 8 == len(set(tree.permutations()))


def test_bad_inputs():
    with pytest.raises(ValueError):
        PQTree([1, 1])
    with pytest.raises(KeyError):
        PQTree([1, 2]).reduce({3})
    empty = PQTree([])
    assert list(empty.permutations()) == [()] and empty.frontier() == [] and empty.count() == 1
