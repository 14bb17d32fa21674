"""Readers and generators of dynagraph.datasets, on inline data (never ../shared)."""
import math

import numpy as np
import pytest

from dynagraph.datasets import (
    Lattice, Tree, Vocab, complete_tree, parse_lattices, parse_tree, read_lattices, read_sst, read_wikiner,
    shared_data_path, synthetic_lattices, synthetic_tagging, synthetic_trees,
)

SST_LINE = r"(3 (2 An) (3 (4 imaginative) (3 (2 comedy\/thriller) (2 .))))"


# ----------------------------------------------------------------------------- trees
def test_parse_tree_structure_and_labels():
    t = parse_tree(SST_LINE)
    assert t.label == 3 and not t.is_leaf() and len(t.children) == 2
    assert t.children[0].is_leaf() and t.children[0].word == "An" and t.children[0].label == 2
    assert [leaf.word for leaf in t.leaves()] == ["An", "imaginative", "comedy/thriller", "."]
    assert [leaf.label for leaf in t.leaves()] == [2, 4, 2, 2]
    assert t.height() == 3


def test_parse_tree_unescapes_ptb_brackets():
    t = parse_tree("(1 (2 -LRB-) (1 (2 A) (3 -RRB-)))")
    assert t.words() == ["(", "A", ")"]
    assert str(t) == "(1 (2 -LRB-) (1 (2 A) (3 -RRB-)))"  # escaping is undone on output


def test_str_round_trips():
    assert str(parse_tree(SST_LINE)) == SST_LINE


def test_postorder_visits_children_first():
    t = parse_tree(SST_LINE)
    order = t.nodes_postorder()
    assert order[-1] is t and len(order) == 7
    pos = {id(n): k for k, n in enumerate(order)}
    for n in order:
        for c in n.children:
            assert pos[id(c)] < pos[id(n)]


def test_single_leaf_tree():
    t = parse_tree("(2 word)")
    assert t.is_leaf() and t.height() == 0 and t.leaves() == [t]


@pytest.mark.parametrize("bad", ["", "(3 (2 a)", "(3 (2 a)))", "(x (2 a))", "(3 a (2 b))", "(3)", "(2 a) (2 b)"])
def test_parse_tree_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_tree(bad)


def test_deep_tree_has_no_recursion_limit():
    depth = 3000
    line = "(1 " * depth + "(2 x)" + ")" * depth
    t = parse_tree(line)
    assert t.height() == depth and len(t.nodes_postorder()) == depth + 1


def test_read_sst_skips_blank_lines(tmp_path):
    p = tmp_path / "sst.txt"
    p.write_text(SST_LINE + "\n\n(1 (0 bad) (2 film))\n")
    trees = read_sst(str(p))
    assert [t.label for t in trees] == [3, 1] and trees[1].words() == ["bad", "film"]


def _is_binary(t: Tree) -> bool:
    return all(n.is_leaf() or len(n.children) == 2 for n in t.nodes_postorder())


def test_synthetic_trees_statistics():
    trees = synthetic_trees(2000, vocab_size=500, min_len=2, max_len=52, mean_len=19, seed=3)
    lengths = np.array([len(t) for t in trees])
    assert lengths.min() >= 2 and lengths.max() <= 52
    assert abs(lengths.mean() - 19) < 1.0 and 6 < lengths.std() < 12  # SST: mean 19.1, std 9.3
    assert all(_is_binary(t) for t in trees)
    heights = np.array([t.height() for t in trees])
    assert np.all(heights >= np.ceil(np.log2(lengths))) and np.all(heights <= lengths - 1)
    labels = {n.label for t in trees for n in t.nodes_postorder()}
    assert labels == set(range(5))
    ids = [int(w[1:]) for t in trees for w in t.words()]
    assert min(ids) >= 0 and max(ids) < 500


def test_synthetic_trees_are_deterministic():
    a = [str(t) for t in synthetic_trees(50, seed=7)]
    assert a == [str(t) for t in synthetic_trees(50, seed=7)]
    assert a != [str(t) for t in synthetic_trees(50, seed=8)]


def test_synthetic_trees_bracketing_varies():
    # Random bracketing: trees of equal length do not all have the same shape.
    trees = [t for t in synthetic_trees(300, seed=0) if len(t) == 12]
    assert len({t.height() for t in trees}) > 2


def test_complete_tree():
    t = complete_tree(16, seed=1)
    assert len(t) == 16 and t.height() == 4 and _is_binary(t)
    with pytest.raises(ValueError):
        complete_tree(12)


# --------------------------------------------------------------------------- tagging
def test_read_wikiner(tmp_path):
    p = tmp_path / "ner.txt"
    p.write_text("Kojima|I-PER played|O .|O\n\na|b|I-MISC\n")
    sents = read_wikiner(str(p))
    assert sents == [[("Kojima", "I-PER"), ("played", "O"), (".", "O")], [("a|b", "I-MISC")]]


def test_read_wikiner_rejects_missing_tag(tmp_path):
    p = tmp_path / "ner.txt"
    p.write_text("word|O untagged\n")
    with pytest.raises(ValueError, match="untagged"):
        read_wikiner(str(p))


def test_synthetic_tagging():
    sents = synthetic_tagging(300, min_len=5, max_len=20, n_tags=7, seed=2)
    lengths = [len(s) for s in sents]
    assert min(lengths) >= 5 and max(lengths) <= 20 and len(set(lengths)) > 10
    assert {t for s in sents for _, t in s} <= {f"T{k}" for k in range(7)}
    # Mostly each word's home tag: the relation is learnable.
    home = [t == f"T{int(w[1:]) % 7}" for s in sents for w, t in s]
    assert 0.75 < np.mean(home) < 0.95
    assert sents == synthetic_tagging(300, min_len=5, max_len=20, n_tags=7, seed=2)


# -------------------------------------------------------------------------- lattices
LATTICE_TEXT = """2
3
0 1 2
0
1 0 7
2 1 8 0 100
4
0 3 3 3
0 
1 0 5
1 1 6
3 2 9 0 101 1 102
"""


def test_parse_lattices():
    lats = parse_lattices(LATTICE_TEXT.splitlines())
    assert len(lats) == 2
    a, b = lats
    assert (a.n, a.tags) == (3, [0, 1, 2])
    assert a.arcs == [[], [(0, 7, True)], [(1, 8, True), (0, 100, False)]]
    assert b.char_arcs() == [(0, 5, True), (1, 6, True), (2, 9, True)]
    assert b.word_arcs() == [(0, 101, False), (1, 102, False)]


def test_read_lattices_file(tmp_path):
    p = tmp_path / "lat.txt"
    p.write_text(LATTICE_TEXT)
    assert [lat.n for lat in read_lattices(str(p))] == [3, 4]


@pytest.mark.parametrize("node_line", ["2 1 8", "1 2 8", "1 5 8"])
def test_parse_lattices_rejects_bad_arcs(node_line):
    text = "1\n3\n0 0 0\n0\n1 0 7\n" + node_line + "\n"
    with pytest.raises(ValueError):
        parse_lattices(text.splitlines())


def test_lattice_checks_lengths():
    with pytest.raises(ValueError):
        Lattice(2, [0], [[], []])


def test_synthetic_lattices():
    lats = synthetic_lattices(200, min_len=5, max_len=40, word_rate=0.5, seed=4)
    assert all(5 <= lat.n <= 40 and len(lat.tags) == lat.n and lat.arcs[0] == [] for lat in lats)
    for lat in lats:
        for i in range(1, lat.n):
            chars = [a for a in lat.arcs[i] if a[2]]
            assert len(chars) == 1 and chars[0][0] == i - 1
            spans = [i - a[0] for a in lat.arcs[i] if not a[2]]
            assert all(2 <= s <= 8 for s in spans) and len(set(spans)) == len(spans)
    rate = np.mean([len(lat.word_arcs()) / lat.n for lat in lats])
    assert 0.3 < rate < 0.8  # real data: ~0.55 word arcs per node
    assert all(not lat.word_arcs() for lat in synthetic_lattices(20, word_rate=0.0))
    again = synthetic_lattices(200, min_len=5, max_len=40, word_rate=0.5, seed=4)
    assert [lat.arcs for lat in lats] == [lat.arcs for lat in again]


# ----------------------------------------------------------------------- vocab, paths
def test_vocab():
    v = Vocab.build(["b", "a", "b", "c", "a", "b", "d"], min_count=2)
    assert len(v) == 3 and v.unk_id == 0
    assert v["b"] == 1 and v["a"] == 2  # by decreasing frequency
    assert v["c"] == v.unk_id and v["never"] == 0 and "c" not in v
    assert v.word(1) == "b"
    tie = Vocab.build(["y", "x"])
    assert (tie["y"], tie["x"]) == (1, 2)  # ties keep first occurrence


def test_shared_data_path(tmp_path, monkeypatch):
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "dev.txt").write_text(SST_LINE)
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))
    assert shared_data_path("sst", "dev.txt") == str(tmp_path / "sst" / "dev.txt")
    assert shared_data_path("sst", "missing.txt") is None
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path / "nowhere"))
    assert shared_data_path("sst") is None


def test_height_matches_log2_for_complete_trees():
    for k in range(5):
        assert complete_tree(2 ** k).height() == k == int(math.log2(len(complete_tree(2 ** k))))
