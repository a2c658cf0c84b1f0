"""Gemm, MatMul and Einsum.

A dense layer exported as ``Gemm(x, W, b, transB=1)`` or ``MatMul(x, W) + b`` must run as
one oneDNN ``FullyConnected`` so imported models are as fast as Gluon-built ones; the
weight symbol is only transposed/reshaped, so it stays the trainable ONNX parameter.
"""
import string

import mxnet as mx
import numpy as np

from ..registry import converter


def _shape(t):
    if t.shape is not None:
        return tuple(t.shape)
    return None if t.const is None else tuple(t.const.shape)


def _scale(node, sym, factor, suffix):
    return sym if factor == 1.0 else mx.sym._internal._mul_scalar(sym, scalar=float(factor),
                                                                   name=node.sub(suffix))


@converter("Gemm", since=1)
def gemm(node, inputs):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
    if c is not None and beta == 0.0:
        c = None
    b_shape, c_shape = _shape(b), None if c is None else _shape(c)
    x = mx.sym.transpose(a.sym, name=node.sub("At")) if trans_a else a.sym
    mm_name = node.name if alpha == 1.0 and c is None else node.sub("mm")
    if b_shape is None:  # weight of unknown size: generic matrix product
        out = mx.sym.dot(x, b.sym, transpose_b=bool(trans_b), name=mm_name)
    else:
        n = b_shape[0] if trans_b else b_shape[1]
        w = b.sym if trans_b else mx.sym.transpose(b.sym, name=node.sub("Wt"))
        if c is not None and alpha == 1.0 and beta == 1.0 and c_shape is not None and \
                len(c_shape) >= 1 and int(np.prod(c_shape)) == n and c_shape[-1] == n:
            bias = c.sym if len(c_shape) == 1 else mx.sym.reshape(c.sym, shape=(-1,), name=node.sub("bias"))
            return mx.sym.FullyConnected(x, weight=w, bias=bias, num_hidden=n, name=node.name)
        out = mx.sym.FullyConnected(x, weight=w, no_bias=True, num_hidden=n, name=mm_name)
    if alpha != 1.0:
        out = mx.sym._internal._mul_scalar(out, scalar=alpha, name=node.sub("alpha") if c is not None else node.name)
    if c is not None:
        out = mx.sym.broadcast_add(out, _scale(node, c.sym, beta, "beta"), name=node.name)
    return out


def _expand_batch(node, sym, rank, target, suffix):
    """Prepend unit axes so both MatMul operands have the same rank (numpy broadcasting)."""
    for i in range(target - rank):
        sym = mx.sym.expand_dims(sym, axis=0, name=node.sub(f"{suffix}{i}"))
    return sym


def _batched_matmul(node, a, b, a_shape, b_shape, name):
    """(..., M, K) x (..., K, N) with numpy batch broadcasting via one batch_dot."""
    rank = max(len(a_shape), len(b_shape))
    a_sym = _expand_batch(node, a, len(a_shape), rank, "Aexp")
    b_sym = _expand_batch(node, b, len(b_shape), rank, "Bexp")
    a_shape = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b_shape = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    grow_a = [i for i in range(rank - 2) if a_shape[i] == 1 and b_shape[i] != 1]
    grow_b = [i for i in range(rank - 2) if b_shape[i] == 1 and a_shape[i] != 1]
    if grow_a:
        a_sym = mx.sym.broadcast_like(a_sym, b_sym, lhs_axes=grow_a, rhs_axes=grow_a, name=node.sub("Abc"))
    if grow_b:
        b_sym = mx.sym.broadcast_like(b_sym, a_sym, lhs_axes=grow_b, rhs_axes=grow_b, name=node.sub("Bbc"))
    return mx.sym.batch_dot(a_sym, b_sym, name=name)


@converter("MatMul", since=1)
def matmul(node, inputs):
    a, b = inputs
    a_shape, b_shape = _shape(a), _shape(b)
    if a_shape is None or b_shape is None:
        raise node.unsupported("operand ranks are unknown; pass input_shapes=... when importing")
    a_sym, b_sym, drop = a.sym, b.sym, []
    if len(a_shape) == 1:  # (K,) is a row vector whose axis is dropped afterwards
        a_sym, a_shape = mx.sym.reshape(a_sym, shape=(1, -1), name=node.sub("Arow")), (1,) + a_shape
        drop.append(-2)
    if len(b_shape) == 1:
        b_sym, b_shape = mx.sym.reshape(b_sym, shape=(-1, 1), name=node.sub("Bcol")), b_shape + (1,)
        drop.append(-1)
    name = node.sub("mm") if drop else node.name
    if len(b_shape) == 2 and b_shape[1] is not None:
        # Dense layer: one FullyConnected over all leading axes of A.
        w = mx.sym.transpose(b_sym, name=node.sub("Wt"))
        out = mx.sym.FullyConnected(a_sym, weight=w, no_bias=True, num_hidden=b_shape[1], flatten=False,
                                    name=name)
    elif len(a_shape) == 2 and len(b_shape) == 2:
        out = mx.sym.dot(a_sym, b_sym, name=name)
    else:
        out = _batched_matmul(node, a_sym, b_sym, a_shape, b_shape, name)
    if not drop:
        return out
    rank = max(len(a_shape), len(b_shape))
    if rank == len(drop):  # vector . vector: ONNX gives a scalar, kept as shape (1,) here
        return mx.sym.reshape(out, shape=(1,), name=node.name)
    return mx.sym.squeeze(out, axis=tuple(rank + d for d in drop), name=node.name)


def _einsum_terms(node, equation, ranks):
    """Operand and output index strings with '...' spelled out as capital letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise node.unsupported(f"equation '{equation}' names {len(terms)} operands, the node has {len(ranks)}")
    n_ell = 0
    spelled = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            k = rank - (len(term) - 3)
            n_ell = max(n_ell, k)
            term = term.replace("...", string.ascii_uppercase[26 - k:] if k else "")
        spelled.append(term)
    ell = string.ascii_uppercase[26 - n_ell:] if n_ell else ""
    if arrow:
        out = out.replace("...", ell)
    else:  # implicit mode: broadcast axes first, then letters used once, alphabetically
        letters = "".join(spelled)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c.islower()))
    for term in spelled + [out]:
        if len(set(term)) != len(term) or not term.isalpha() and term:
            raise node.unsupported(f"equation '{equation}' repeats an index within one operand (diagonals) "
                                   f"or is malformed; only products, contractions, sums and transposes "
                                   f"are supported")
    return spelled, out


def _sum_out(node, sym, term, keep, tag):
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if not axes:
        return sym, term
    return mx.sym.sum(sym, axis=axes, name=node.sub(f"sum{tag}")), "".join(c for c in term if c in keep)


def _transpose(node, sym, term, order, tag):
    if term == order:
        return sym
    return mx.sym.transpose(sym, axes=tuple(term.index(c) for c in order), name=node.sub(f"T{tag}"))


def _contract(node, a, a_term, b, b_term, keep, sizes, tag):
    """Two-operand einsum as one batch_dot; returns the result and its index string."""
    a, a_term = _sum_out(node, a, a_term, set(b_term) | keep, f"a{tag}")
    b, b_term = _sum_out(node, b, b_term, set(a_term) | keep, f"b{tag}")
    batch = "".join(c for c in a_term if c in b_term and c in keep)
    contr = "".join(c for c in a_term if c in b_term and c not in keep)
    a_only = "".join(c for c in a_term if c not in b_term)
    b_only = "".join(c for c in b_term if c not in a_term)
    static = a_only + contr + b_only
    if any(sizes.get(c) is None for c in static):
        raise node.unsupported("the non-batch axes of the operands need static sizes; "
                               "pass input_shapes=... when importing")
    m, k, n = (int(np.prod([sizes[c] for c in part])) for part in (a_only, contr, b_only))
    a_t = _transpose(node, a, a_term, batch + a_only + contr, f"a{tag}")
    a3 = mx.sym.reshape(a_t, shape=(-1, m, k), name=node.sub(f"a3{tag}"))
    b3 = mx.sym.reshape(_transpose(node, b, b_term, batch + contr + b_only, f"b{tag}"), shape=(-1, k, n),
                        name=node.sub(f"b3{tag}"))
    out = mx.sym.batch_dot(a3, b3, name=node.sub(f"bdot{tag}"))
    tail = tuple(sizes[c] for c in a_only + b_only)
    if all(sizes.get(c) is not None for c in batch):
        shape = tuple(sizes[c] for c in batch) + tail
    else:  # free batch sizes are taken back from the transposed operand
        out = mx.sym.reshape_like(out, a_t, lhs_begin=0, lhs_end=1, rhs_begin=0, rhs_end=len(batch),
                                  name=node.sub(f"batch{tag}"))
        shape = (0,) * len(batch) + tail
    return mx.sym.reshape(out, shape=shape or (1,), name=node.sub(f"out{tag}")), batch + a_only + b_only


@converter("Einsum", since=12)
def einsum(node, inputs):
    """Products, contractions, sums and transposes, folded pairwise into batch_dot."""
    shapes = [_shape(t) for t in inputs]
    if any(s is None for s in shapes):
        raise node.unsupported("operand ranks are unknown; pass input_shapes=... when importing")
    terms, out = _einsum_terms(node, node.attr("equation", ""), [len(s) for s in shapes])
    sizes = {}
    for term, shape in zip(terms, shapes):
        for c, d in zip(term, shape):
            if d is not None and d != 1 or c not in sizes:
                sizes[c] = d
    sym, term = inputs[0].sym, terms[0]
    for i in range(1, len(inputs)):
        keep = set(out).union(*terms[i + 1:])
        sym, term = _contract(node, sym, term, inputs[i].sym, terms[i], keep, sizes, str(i))
    sym, term = _sum_out(node, sym, term, set(out), "out")
    if not term and not out:
        return mx.sym.reshape(sym, shape=(1,), name=node.name)
    return mx.sym.transpose(sym, axes=tuple(term.index(c) for c in out), name=node.name) if term != out \
        else mx.sym.identity(sym, name=node.name)
