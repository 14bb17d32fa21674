"""Batching statistics and the debug listing."""
import numpy as np
import pytest

import dynagraph as dy


def _chains(n_samples: int, length: int, scheduler: str):
    pc = dy.ParameterCollection()
    W = pc.add_parameters((3, 3))
    cg = dy.renew_cg(scheduler=scheduler)
    outs = []
    for s in range(n_samples):
        h = dy.inputVector(np.arange(3.0) + s)
        for _ in range(length):
            h = dy.tanh(W * h)
        outs.append(dy.sum_elems(h))
    loss = dy.esum(outs)
    return cg, loss


def test_depth_batches_identical_chains_into_one_batch_per_step():
    cg, loss = _chains(5, 4, "depth")
    loss.backward()
    s = cg.stats
    # input, 4 x (matmul, tanh), sum_elems, esum
    assert s.batches == 1 + 4 * 2 + 1 + 1
    assert s.nodes == 5 * (1 + 8 + 1) + 1
    assert s.lower_bound == s.batches
    assert s.gathers == 0  # every argument list is a contiguous run of one block
    assert s.by_op()["tanh"] == (20, 4)


def test_none_runs_every_node_alone_and_counts_kernels():
    cg, loss = _chains(3, 2, "none")
    loss.backward()
    s = cg.stats
    assert s.batches == s.nodes == 3 * (1 + 4 + 1) + 1
    assert s.kernel_calls > s.batches  # backward kernels are counted too
    assert s.lower_bound == 1 + 2 * 2 + 1 + 1


def test_time_split_and_dict():
    cg, loss = _chains(2, 2, "agenda")
    loss.value()
    d = cg.stats.as_dict()
    for k in ("t_record", "t_schedule", "t_execute", "t_memory", "t_backward"):
        assert d[k] >= 0.0
    assert d["lower_bound"] == 7 and d["batches"] == 7
    assert "nodes=" in str(cg.stats)


def test_describe_batches_lists_op_and_size(capsys):
    cg, loss = _chains(4, 1, "depth")
    loss.value()
    cg.print_batches()
    out = capsys.readouterr().out
    assert "matmul" in out and "x 4" in out
    assert out.count("batch ") == cg.stats.batches


def test_gathers_counted_when_rows_are_not_contiguous():
    pc = dy.ParameterCollection()
    W = pc.add_parameters((2, 2))
    cg = dy.renew_cg(scheduler="depth")
    xs = [dy.inputVector([1.0, float(i)]) for i in range(4)]
    ys = [W * x for x in reversed(xs)]  # reversed order: needs one gather
    dy.esum([dy.sum_elems(y) for y in ys]).value()
    assert cg.stats.gathers == 1
    assert cg.stats.gather_bytes == 4 * 2 * np.dtype(cg.dtype).itemsize


@pytest.mark.parametrize("autobatch,name", [(0, "none"), (1, "lookahead"), (2, "depth")])
def test_config_autobatch_maps_to_scheduler(autobatch, name):
    old = dy.config.get()
    try:
        dy.config.set(autobatch=autobatch, mem=512)
        assert dy.config.get()["scheduler"] == name
        assert dy.renew_cg().scheduler == name
    finally:
        dy.config.set(scheduler=old["scheduler"])


def test_config_rejects_unknown_keys():
    with pytest.raises(TypeError, match="unknown"):
        dy.config.set(colour="blue")


def test_unknown_scheduler_lists_available():
    dy.renew_cg(scheduler="nope")
    x = dy.inputVector([1.0])
    with pytest.raises(ValueError, match="agenda"):
        x.value()


def test_custom_scheduler_plugin():
    class InOrder:
        name = "in-order"

        def schedule(self, cg, nodes):
            return [[n] for n in nodes]

    dy.schedulers.register("mine", InOrder)
    assert "mine" in dy.schedulers.available()
    cg = dy.renew_cg(scheduler="mine")
    assert dy.tanh(dy.inputVector([0.5])).value() == pytest.approx(np.tanh(0.5))
    cg2 = dy.renew_cg(scheduler=InOrder())
    assert dy.tanh(dy.inputVector([0.5])).value() == pytest.approx(np.tanh(0.5))
    assert cg2 is not cg


@pytest.mark.parametrize("bad", ["drop", "mix", "order"])
def test_invalid_custom_schedule_is_rejected(bad):
    class Broken:
        name = "broken"

        def schedule(self, cg, nodes):
            if bad == "drop":
                return [[n] for n in nodes[:-1]]
            if bad == "mix":
                return [list(nodes)]
            return [[n] for n in reversed(nodes)]

    dy.renew_cg(scheduler=Broken())
    x = dy.inputVector([1.0, 2.0])
    y = dy.sum_elems(dy.tanh(x))
    with pytest.raises(dy.DynagraphError, match="scheduler broken"):
        y.value()


def _lstm_block_stats(plan):
    """cg.stats of a dy.block LSTM cell over a mini-batch of sequences, forward and backward."""
    H = 4
    dy.reset_random_seed(0)
    pc = dy.ParameterCollection()
    Wx, Wh, b = pc.add_parameters((4 * H, H)), pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H)
    E = pc.add_lookup_parameters((10, H))

    def cell(x, h, c):
        g = dy.affine_transform([b, Wx, x, Wh, h])
        i, f, o = dy.logistic(g[0:H]), dy.logistic(g[H:2 * H]), dy.logistic(g[2 * H:3 * H])
        c2 = dy.cmult(f, c) + dy.cmult(i, dy.tanh(g[3 * H:4 * H]))
        return dy.cmult(o, dy.tanh(c2)), c2

    blk = dy.block(cell, plan=plan)
    cg = dy.renew_cg()
    losses = []
    for s in range(5):
        h = c = dy.zeros(H)
        for t in range(3):
            h, c = blk(E[(s + t) % 10], h, c)
        losses.append(dy.sum_elems(h))
    loss = dy.esum(losses)
    loss.value()
    loss.backward()
    return cg, loss.value()


def test_block_copies_show_what_the_planned_layout_saves(capsys):
    """The executor's gathers of a block's arguments are the same for every plan; the copies
    inside the plan are not: "naive" copies each group's operand list, "planned" reads the
    layout's consecutive operands in place (block_copies counts both directions)."""
    none, v0 = _lstm_block_stats(None)
    naive_cg, v1 = _lstm_block_stats("naive")
    planned, v2 = _lstm_block_stats("planned")
    none, naive, planned = none.stats, naive_cg.stats, planned.stats
    assert v0 == pytest.approx(v1) and v0 == pytest.approx(v2)
    assert none.gather_bytes == naive.gather_bytes == planned.gather_bytes
    assert none.block_copies == 0
    assert naive.block_copies > 0 and naive.block_copy_bytes > 0
    assert planned.block_copy_bytes < naive.block_copy_bytes
    assert f"block_copies={naive.block_copies}" in str(naive)
    naive_cg.print_batches()
    assert f"copies inside blocks and coarsened groups: {naive.block_copies}" in capsys.readouterr().out


SENTENCES = ([1, 4, 2], [3, 5], [6, 7, 8, 9])


def _apart(pc, scheduler: str = "agenda", check_validity: bool = False):
    """A tiny RNN per sentence, h = tanh(W h + E[w]) (examples/teach/01): each step's `add`
    reads its E[w] rows out of order from the lookups' block, so the cpu backend runs that
    batch of three or fewer node by node, cheaper than gathering the rows."""
    if not pc.parameters_list():
        pc.parameters_from_numpy(np.arange(16.0).reshape(4, 4) / 32)
        pc.lookup_parameters_from_numpy(np.arange(40.0).reshape(10, 4) / 40)
    W, E = pc.parameters_list()[0], pc.lookup_parameters_list()[0]
    cg = dy.renew_cg(scheduler=scheduler, check_validity=check_validity)
    scores = []
    for words in SENTENCES:
        h = dy.zeros(4)
        for w in words:
            h = dy.tanh(W * h + E[w])
        scores.append(dy.sum_elems(h))
    return cg, dy.esum(scores)


@pytest.mark.parametrize("check_validity", [False, True])  # compiled batch step, and its Python twin
def test_a_batch_run_in_parts_counts_as_one_batch(check_validity):
    pc = dy.ParameterCollection()
    cg, loss = _apart(pc, check_validity=check_validity)
    cg.stats.batch_log = []
    value = loss.value()
    s = cg.stats
    scheduled = cg.executed_batches()
    assert s.batches == len(scheduled) == len(s.batch_log)
    assert [n for n, _ in s.batch_log] == [cg.op[b[0]].name for b in scheduled]
    assert [size for _, size in s.batch_log] == [len(b) for b in scheduled]
    assert s.by_op()["add"][0] == sum(map(len, SENTENCES))
    if dy.config.get()["backend"] == "cpu":
        assert s.kernel_calls > s.batches  # the add batch ran in parts, each a kernel call
    assert value == pytest.approx(_apart(pc, "none")[1].value(), rel=1e-12)


def test_executed_batches_after_set_are_the_kept_records():
    cg, loss = _apart(dy.ParameterCollection())
    x = dy.inputVector([1.0, 2.0, 3.0, 4.0])
    y = dy.sum_elems(dy.tanh(x))
    loss.value()
    y.value()
    assert len(cg.executed_batches()) == cg.stats.batches
    x.set([0.5, 0.5, 0.5, 0.5])  # DyNet's Expression.set: x's users recompute
    kept = [list(n) for r in cg.executed for n in ([r.nodes] if not hasattr(r, "steps") else r.steps)]
    assert cg.executed_batches() == kept
    assert not any(y.i in b for b in kept)
    y.value()
    assert any(y.i in b for b in cg.executed_batches())
