"""TensorFlow graph analysis: a cell written by hand (no declarations) has its products found in
its captured graph, and the replayed rewrite computes the cell's own loss and gradients under
every choice; what the replay cannot re-create leaves the model unrewritten."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _support import lazy_import, needs

from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

# TensorFlow, the modules that import it and the cells written for these tests are imported by
# the first test that uses them, not when each xdist worker collects this file.
tf = lazy_import("tensorflow")
_tf = lazy_import("microco.clients.compiler._tf")
_graph = lazy_import("microco.clients.compiler._tf_graph")
cells = lazy_import("_tf_cells")

pytestmark = [pytest.mark.tensorflow, needs("tensorflow")]


def _loss(logits, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _batch(steps=4, batch=3, inp=5, classes=3):
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((steps, batch, inp)).astype(np.float32))
    return x, tf.constant(rng.integers(0, classes, (batch,)).astype(np.int32))


def test_products_of_a_hand_written_cell_are_found_in_its_graph():
    cell = cells.MinimalGatedCell(5, 7, np.random.default_rng(0))
    cg = _graph.analyse_cell(cell, [3, 5])
    # Input products: the biased gate projection and the candidate projection (used twice, one
    # product); the recurrent product of h; `(gate * h) @ u_cand` reads an intermediate: not one.
    assert {(p.kernel.ref(), p.bias is not None) for p in cg.x_products.values()} == {
        (cell.w_gate.ref(), True),
        (cell.w_cand.ref(), False),
    }
    cand = next(p for p in cg.x_products.values() if p.kernel is cell.w_cand)
    assert len(cand.replaces) == 2
    assert [p.kernel.ref() for p in cg.h_products[0].values()] == [cell.u_gate.ref()]
    assert cg.h_shape.as_list() == [3, 7]


def test_replay_computes_the_cell_and_uses_the_values_it_is_given():
    cell = cells.MinimalGatedCell(5, 7, np.random.default_rng(0))
    cg = _graph.analyse_cell(cell, [3, 5])
    x = tf.constant(np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32))
    h0 = tf.constant(np.random.default_rng(3).standard_normal((3, 7)).astype(np.float32))
    direct, _ = cell(x, (h0,))
    replayed, _ = cg.replay(x, (h0,))
    np.testing.assert_allclose(replayed.numpy(), direct.numpy(), rtol=1e-6, atol=1e-6)
    # A product's value supplied from outside is the one the rest of the cell reads.
    gate_key = next(k for k, p in cg.x_products.items() if p.kernel is cell.w_gate)
    exact = tf.matmul(x, cell.w_gate) + cell.b_gate
    np.testing.assert_allclose(cg.replay(x, (h0,), {gate_key: exact})[0].numpy(), direct.numpy(), atol=1e-6)
    shifted, _ = cg.replay(x, (h0,), {gate_key: exact + 5.0})
    assert not np.allclose(shifted.numpy(), direct.numpy(), atol=1e-3)


def test_a_supplied_product_is_not_computed_again():
    cell = cells.MinimalGatedCell(5, 7, np.random.default_rng(0))
    cg = _graph.analyse_cell(cell, [3, 5])
    products = {**cg.x_products, **cg.h_products[0]}

    def traced(supply):
        def step(x, h):
            values = {
                k: tf.matmul(h if p.source == "s0" else x, p.kernel) for k, p in products.items() if supply
            }
            return cg.replay(x, (h,), values)[0]

        graph = tf.function(step).get_concrete_function(tf.TensorSpec([3, 5]), tf.TensorSpec([3, 7])).graph
        return sum(op.type == "MatMul" for op in graph.get_operations())

    # Replayed as written: five MatMuls (the candidate projection twice, the intermediate's).
    assert traced(False) == 5
    # Every product supplied (three MatMuls made outside, the repeated one once): the replay
    # adds only the intermediate's.
    assert traced(True) == 3 + 1


def test_every_choice_over_the_analysed_graph_matches_the_users_own_step():
    model = cells.Stack(cells.MinimalGatedCell)
    x, y = _batch(steps=2)  # two time steps, two layers: a state carried, a stacked output read (8 traces)
    with tf.GradientTape() as tape:
        loss = _loss(model(x), y)
    ref_loss, ref = loss.numpy(), [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    for hoist, batch, loop in itertools.product([False, True], repeat=3):

        @tf.function
        def step(x, y, hoist=hoist, batch=batch, loop=loop):
            with tf.GradientTape() as tape:
                loss = _loss(_tf.run_model(model, x, hoist, batch, loop=loop), y)
            return loss, tape.gradient(loss, model.trainable_variables)

        loss, grads = step(x, y)
        assert np.isclose(loss.numpy(), ref_loss, atol=1e-5), (hoist, batch, loop)
        assert len(grads) == len(ref) and all(g is not None for g in grads)
        for a, b in zip(grads, ref):
            np.testing.assert_allclose(a.numpy(), b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cell_cls, why", [("RandomCell", "RandomUniform"), ("NoProductCell", "no product")])
def test_a_cell_the_rewrite_cannot_replay_is_run_as_it_is(cell_cls, why):
    model = cells.Stack(getattr(cells, cell_cls))
    x, y = _batch()
    ok, reason = _graph.analyse_model(model, x)
    assert not ok and why in reason
    assert _graph.structure_of(model.cells[0]) is None
    with pytest.raises(_graph.NotReplayable):
        _tf.run_model(model, x, False, False)
    # The wrapper trains it all the same, over XLA alone (off / plain), on the user's forward.
    astra = _tf.AstraTF(
        model,
        tf.keras.optimizers.SGD(0.05),
        _loss,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1)),
        total_steps=10,
        xla=False,
    )
    losses = [astra.step(x, y) for _ in range(3)]
    assert not astra.structured and why in astra.structure
    assert astra.session.spec is not None and astra.session.spec.variables == ()
    assert all(np.isfinite(losses))


def test_the_wrapper_explores_the_space_found_in_the_graph():
    model = cells.Stack(cells.MinimalGatedCell, layers=1)
    x, y = _batch()
    astra = _tf.AstraTF(
        model,
        tf.keras.optimizers.SGD(0.05),
        _loss,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1)),
        total_steps=10**6,
        xla=False,
    )
    losses = [astra.step(x, y)]
    while not astra.committed and len(losses) < 200:
        losses.append(astra.step(x, y))
    assert astra.structured and "MinimalGatedCell" in astra.structure
    assert {v.name for v in astra.session.spec.variables} == {"hoist", "batch"}
    assert astra.committed and astra.explore_steps >= 8 and losses[-1] < losses[0]
