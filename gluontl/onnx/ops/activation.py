"""Activations: Relu, ..."""
import mxnet as mx

from ..registry import converter


@converter("Relu", since=6)
def relu(node, inputs):
    return mx.sym.relu(inputs[0].sym, name=node.name)
