"""A graph whose token table is tied to its output layer, as the real members' are, converted
to a precision and read through onnxruntime: the rows the bundle's Gather gives."""

from __future__ import annotations

from typing import Any

import numpy as np


def tied_table_rows(table: np.ndarray, precision: str, ids: np.ndarray) -> tuple[np.ndarray, Any]:
    """``table`` (vocab, hidden) float32 as a Gather's table and, transposed, the output
    layer's weight; tied (export/weights.py's ``tie_output_layer``) and converted to
    ``precision``; → (the embeddings onnxruntime gathers for ``ids`` (1, n), the converted
    model)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.export.precision import convert_precision
    from spotstop.export.weights import tie_output_layer

    vocab, hidden = table.shape
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Transpose", ["table"], ["tT"], perm=[1, 0], name="tt"),
        helper.make_node("MatMul", ["e", "tT"], ["logits"], name="head"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        [
            helper.make_tensor_value_info("e", TensorProto.FLOAT, [None, None, hidden]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, None, vocab]),
        ],
        [numpy_helper.from_array(table, "table")],
    )
    model = tie_output_layer(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    q = convert_precision(model, precision)
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    (e, _) = sess.run(None, {"ids": ids})
    return e[0], q
