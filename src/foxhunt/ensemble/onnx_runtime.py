"""The TFT member's per-bar graphs in ONNX Runtime, fp32 or int8, and their export.

A new bar of the TFT needs three computations (:mod:`foxhunt.ensemble.members`): the encoder
variable selection of that bar (its known variables' part, a function of the calendar alone, is
computed once per minute and ahead: ``encode_known``; the rest per stream: ``select_past``), the
decoder selection of each future minute not seen before,
and the LSTM encoder-decoder, enrichment, attention and heads of the 50-bar window (``fuse``:
the LSTM's initial state is the static context at the window's first bar, so the encoder runs
over the whole window again on every bar; the math allows no shortcut there). In torch eager
each is a few hundred operators at a few microseconds of dispatch each; ONNX Runtime runs the
same graph, fused, at fixed dimensions, in a fraction of torch's time (the figures:
docs/benchmarks.md; ``scripts/benchmark.py``'s streaming section times the TFT member every run).

:func:`export_tft` writes the four graphs (``torch.onnx.export``, a batch axis of any size);
``int8`` quantizes them with ONNX Runtime's dynamic quantization (int8 weights of every MatMul,
Gemm and LSTM, activations quantized per call): a quarter of the weight bytes, and faster
(docs/benchmarks.md). :class:`Graph` is one inference session on one thread pool of
``threads`` threads.

Written here, not taken whole from a library: ONNX Runtime and ``torch.onnx`` are the
libraries; this module only says which parts of the TFT become graphs, with which inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn

from foxhunt.models.tft import StaticContexts

GRAPHS = ("encode_known", "select_past", "select_future", "fuse")
OPSET = 17
INT8_OPS = ["MatMul", "Gemm", "LSTM"]


class _EncodeKnown(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, known):  # (M, 1, K) -> (M, 1, K, d): the known variables' encoder outputs
        return self.model.encode_known(known)


class _SelectPast(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, known, observed, known_outputs, selection):  # (B, 1, K), (B, 1, O), (B, 1, K, d), (B, d) -> (B, 1, d)

        contexts = StaticContexts(selection, selection, selection, (selection, selection))
        return self.model.select_past_given(known, observed, contexts, known_outputs)[0]


class _SelectFuture(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, known, selection):  # (M, 1, K), (M, d) -> (M, 1, d)

        contexts = StaticContexts(selection, selection, selection, (selection, selection))
        return self.model.select_future(known, contexts)[0]


class _Fuse(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, past, future, enrichment, state_h, state_c):  # (B, L, d), (B, H, d), (B, d), (layers, B, d) x 2

        contexts = StaticContexts(enrichment, enrichment, enrichment, (state_h, state_c))
        return self.model.fuse(contexts, past, future)[0]


def export_tft(model, folder: Path, int8: bool = False) -> dict[str, Path]:
    """The TFT's four per-bar graphs as ONNX files under ``folder`` (name -> path); ``int8``:
    dynamically quantized copies. The model is not changed."""
    folder.mkdir(parents=True, exist_ok=True)
    d, layers = model.encoder_lstm.hidden_size, model.lstm_layers
    known, observed = model.known_dim, model.observed_dim
    examples = {
        "encode_known": (_EncodeKnown(model), (torch.zeros(2, 1, known),), ["known"], {"known": {0: "m"}}),
        "select_past": (_SelectPast(model), (torch.zeros(2, 1, known), torch.zeros(2, 1, observed), torch.zeros(2, 1, known, d),
                                             torch.zeros(2, d)),
                        ["known", "observed", "known_outputs", "selection"],
                        {"known": {0: "b"}, "observed": {0: "b"}, "known_outputs": {0: "b"}, "selection": {0: "b"}}),
        "select_future": (_SelectFuture(model), (torch.zeros(2, 1, known), torch.zeros(2, d)), ["known", "selection"],
                          {"known": {0: "m"}, "selection": {0: "m"}}),
        "fuse": (_Fuse(model), (torch.zeros(2, model.seq_len, d), torch.zeros(2, model.horizon, d), torch.zeros(2, d),
                                torch.zeros(layers, 2, d), torch.zeros(layers, 2, d)),
                 ["past", "future", "enrichment", "state_h", "state_c"],
                 {"past": {0: "b"}, "future": {0: "b"}, "enrichment": {0: "b"}, "state_h": {1: "b"}, "state_c": {1: "b"}}),
    }  # fmt: skip
    paths = {}
    was_training = model.training
    model.eval()
    try:
        for name, (module, args, inputs, axes) in examples.items():
            path = folder / f"tft_{name}.onnx"
            with torch.no_grad():
                torch.onnx.export(module, args, str(path), input_names=inputs, output_names=["output"],
                                  dynamic_axes={**axes, "output": {0: "b"}}, opset_version=OPSET, dynamo=False)  # fmt: skip
            if int8:
                path = quantize(path, folder / f"tft_{name}_int8.onnx")
            paths[name] = path
    finally:
        model.train(was_training)
    return paths


def quantize(path: Path, target: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantization of the graph at ``path``, written to ``target``."""
    quantize_dynamic(str(path), str(target), weight_type=QuantType.QInt8, op_types_to_quantize=INT8_OPS)
    return target


@dataclass
class Graph:
    """One ONNX Runtime session (CPU) and the bytes of the weights its graph holds."""

    session: Any  # an onnxruntime.InferenceSession (the package ships no types)
    inputs: tuple[str, ...]
    weight_bytes: int

    @classmethod
    def load(cls, path: Path, threads: int) -> Graph:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        proto = onnx.load(str(path))
        weights = sum(int(np.prod(t.dims)) * _itemsize(t.data_type) for t in proto.graph.initializer)
        return cls(session, tuple(i.name for i in session.get_inputs()), int(weights))

    def __call__(self, **feeds: np.ndarray) -> np.ndarray:
        return self.session.run(None, {name: feeds[name] for name in self.inputs})[0]


def _itemsize(onnx_type: int) -> int:
    return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type)).itemsize)
