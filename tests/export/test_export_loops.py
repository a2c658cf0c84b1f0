"""Export's clean-up keeps what only a Loop body reads from the enclosing graph by name
(tf2onnx's Keras SimpleRNN Gathers the outer sequence; the onnx.helper LSTM of
tests/onnx/test_control_flow.py also reads W, R and B): such nodes are not dead and such
initializers not unused. Before, re-exporting the SimpleRNN fixture dropped the Transpose the
body reads and onnx's checker refused the file (tests/onnx/test_tf2onnx_fixtures.py re-exports
it)."""
from __future__ import annotations

from gluontl.export.lean import drop_dead_nodes, prune_initializers
from tests.onnx.test_control_flow import lstm_loop_model


def test_what_only_a_loop_body_reads_is_kept():
    model = lstm_loop_model()
    graph = model.graph
    assert drop_dead_nodes(graph) == 0
    prune_initializers(graph)
    assert {"Xt"} <= {o for n in graph.node for o in n.output}  # read only inside the body
    assert {"W", "R", "Bias"} <= {t.name for t in graph.initializer}
    graph.node.remove(next(n for n in graph.node if n.op_type == "Loop"))
    assert drop_dead_nodes(graph) > 0  # without the Loop, Xt and the zero state are dead
    prune_initializers(graph)
    assert "W" not in {t.name for t in graph.initializer}

