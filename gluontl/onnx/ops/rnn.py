"""LSTM, GRU and RNN.

The common variants run as MXNet's fused ``RNN`` op (oneDNN). Its flat parameter
vector is assembled symbolically (slice, reorder gates, concat) from the ONNX W/R/B
symbols, so those stay the trainable parameters and receive the gradients.
Variants the fused kernel cannot express (GRU linear_before_reset=0, peepholes, clip,
other activations, shorter sequence_lens) are unrolled over the static time axis.
"""
import mxnet as mx
import numpy as np

from ..registry import converter

# gates per cell, ONNX default activations per direction, ONNX gate index for MXNet slot k.
_CELLS = {
    "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"], [0, 2, 3, 1]),  # ONNX iofc -> MXNet ifco
    "GRU": (3, ["Sigmoid", "Tanh"], [1, 0, 2]),              # ONNX zrh -> MXNet rzn
    "RNN": (1, ["Tanh"], [0]),
}

_ACTS = {
    "sigmoid": lambda s, name: mx.sym.Activation(s, act_type="sigmoid", name=name),
    "tanh": lambda s, name: mx.sym.Activation(s, act_type="tanh", name=name),
    "relu": lambda s, name: mx.sym.Activation(s, act_type="relu", name=name),
    "softsign": lambda s, name: mx.sym.Activation(s, act_type="softsign", name=name),
    "softplus": lambda s, name: mx.sym.Activation(s, act_type="softrelu", name=name),
    "hardsigmoid": lambda s, name: mx.sym.hard_sigmoid(s, alpha=0.2, beta=0.5, name=name),
    "leakyrelu": lambda s, name: mx.sym.LeakyReLU(s, act_type="leaky", slope=0.01, name=name),
    "elu": lambda s, name: mx.sym.LeakyReLU(s, act_type="elu", slope=1.0, name=name),
}


def _opt(inputs, i):
    return inputs[i] if len(inputs) > i else None


def _direction(node, sym, d, tag):
    """The (rows, cols) matrix of direction ``d`` from a (D, rows, cols) tensor."""
    one = mx.sym.slice_axis(sym, axis=0, begin=d, end=d + 1, name=node.sub(f"{tag}{d}_slice"))
    return mx.sym.reshape(one, shape=(-3, 0), name=node.sub(f"{tag}{d}"))


def _reorder(node, sym, n_gates, order, tag):
    """Flat vector of ``sym`` (gate-major rows) with its gates in MXNet's order."""
    gates = mx.sym.reshape(sym, shape=(n_gates, -1), name=node.sub(f"{tag}_gates"))
    if order != list(range(n_gates)):
        parts = [mx.sym.slice_axis(gates, axis=0, begin=g, end=g + 1, name=node.sub(f"{tag}_gate{g}"))
                 for g in order]
        gates = mx.sym.concat(*parts, dim=0, name=node.sub(f"{tag}_reordered"))
    return mx.sym.reshape(gates, shape=(-1,), name=node.sub(f"{tag}_flat"))


def _bias_halves(node, b, d, gh):
    bd = _direction(node, mx.sym.expand_dims(b, axis=2, name=node.sub(f"B3_{d}")), d, "B")  # (2GH, 1)
    return (mx.sym.slice_axis(bd, axis=0, begin=0, end=gh, name=node.sub(f"Wb{d}")),
            mx.sym.slice_axis(bd, axis=0, begin=gh, end=2 * gh, name=node.sub(f"Rb{d}")))


def _fused_params(node, kind, w, r, b, dirs, hidden):
    """MXNet's layout: all (W, R) per direction, then all (Wb, Rb) per direction."""
    n_gates, _, order = _CELLS[kind]
    weights, biases = [], []
    for d in range(dirs):
        weights += [_reorder(node, _direction(node, w, d, "W"), n_gates, order, f"W{d}"),
                    _reorder(node, _direction(node, r, d, "R"), n_gates, order, f"R{d}")]
        if b is not None:
            wb, rb = _bias_halves(node, b, d, n_gates * hidden)
            biases += [_reorder(node, wb, n_gates, order, f"Wb{d}"), _reorder(node, rb, n_gates, order, f"Rb{d}")]
    if b is None:
        biases = [mx.sym.zeros(shape=(dirs * 2 * n_gates * hidden,), name=node.sub("zero_bias"))]
    return mx.sym.concat(*weights, *biases, dim=0, name=node.sub("params"))


def _initial_state(node, t, x_tnc, dirs, hidden, layout, tag):
    if t is not None:
        return mx.sym.transpose(t.sym, axes=(1, 0, 2), name=node.sub(f"{tag}_tnc")) if layout else t.sym
    zeros = mx.sym.zeros(shape=(dirs, 1, hidden), name=node.sub(f"{tag}_zero"))
    return mx.sym.broadcast_like(zeros, x_tnc, lhs_axes=(1,), rhs_axes=(1,), name=node.sub(f"{tag}_init"))


def _fused(node, kind, x_tnc, w, r, b, h0, c0, dirs, hidden, reverse):
    params = _fused_params(node, kind, w, r, b, dirs, hidden)
    mode = {"LSTM": "lstm", "GRU": "gru"}.get(kind) or \
        ("rnn_relu" if node.attr("activations", ["Tanh"])[0].lower() == "relu" else "rnn_tanh")
    data = mx.sym.reverse(x_tnc, axis=0, name=node.sub("rev_in")) if reverse else x_tnc
    extra = {"state_cell": c0} if kind == "LSTM" else {}
    out = mx.sym.RNN(data=data, parameters=params, state=h0, state_size=hidden, num_layers=1,
                     bidirectional=dirs == 2, mode=mode, state_outputs=True, name=node.sub("rnn"), **extra)
    y = mx.sym.reverse(out[0], axis=0, name=node.sub("rev_out")) if reverse else out[0]
    y = mx.sym.reshape(y, shape=(0, 0, dirs, -1), name=node.sub("Y_split"))  # (T, N, D, H)
    return y, out[1], out[2] if kind == "LSTM" else None


class _Unrolled:
    """One direction of the cell, step by step; masks freeze the state past each sequence's end."""

    def __init__(self, node, kind, w, r, b, p, d, hidden, acts):
        self.node, self.kind, self.hidden, self.d = node, kind, hidden, d
        self.w, self.r = _direction(node, w, d, "W"), _direction(node, r, d, "R")
        self.wb, self.rb = _bias_halves(node, b, d, _CELLS[kind][0] * hidden) if b is not None else (None, None)
        self.p = None if p is None else mx.sym.reshape(
            _direction(node, mx.sym.expand_dims(p, axis=2, name=node.sub(f"P3_{d}")), d, "P"), shape=(-1,),
            name=node.sub(f"P{d}_flat"))
        self.acts = acts
        self.clip = node.attr("clip")
        self.input_forget = bool(node.attr("input_forget", 0))
        self.lbr = bool(node.attr("linear_before_reset", 0))
        if kind == "GRU" and not self.lbr:
            # Reset is applied before the recurrent product of the h gate, so R splits in two.
            self.reset_split = ((self.rows(self.r, 0, 2, "R_zr"), self.rows(self.rb, 0, 2, "Rb_zr")),
                                (self.rows(self.r, 2, 3, "R_h"), self.rows(self.rb, 2, 3, "Rb_h")))

    def rows(self, sym, lo, hi, tag):
        """Gate blocks lo..hi of a gate-major weight or bias (None stays None)."""
        if sym is None:
            return None
        return mx.sym.slice_axis(sym, axis=0, begin=lo * self.hidden, end=hi * self.hidden,
                                 name=self.node.sub(f"d{self.d}_{tag}"))

    def name(self, tag, t):
        return self.node.sub(f"d{self.d}_t{t}_{tag}")

    def add(self, a, b, tag, t):
        return mx.sym.elemwise_add(a, b, name=self.name(tag, t))

    def mul(self, a, b, tag, t):
        return mx.sym.broadcast_mul(a, b, name=self.name(tag, t))

    def fc(self, data, weight, bias, rows, name, flatten=True):
        extra = {"no_bias": True} if bias is None else {
            "bias": mx.sym.reshape(bias, shape=(-1,), name=name + "_bias")}
        return mx.sym.FullyConnected(data, weight=weight, num_hidden=rows, flatten=flatten, name=name, **extra)

    def act(self, k, s, t, tag):
        if self.clip is not None:
            s = mx.sym.clip(s, a_min=-self.clip, a_max=self.clip, name=self.name(tag + "_clip", t))
        return _ACTS[self.acts[k]](s, self.name(tag, t))

    def input_projection(self, x_tnc):
        rows = _CELLS[self.kind][0] * self.hidden
        return self.fc(x_tnc, self.w, self.wb, rows, self.node.sub(f"d{self.d}_xw"), flatten=False)

    def gates(self, sym, n, t, tag):
        return mx.sym.split(sym, num_outputs=n, axis=1, name=self.name(tag, t))

    def peephole(self, gate, k, cell, t):
        """Gate pre-activation plus P[k] * cell (P is ONNX-ordered i, o, f)."""
        if self.p is None:
            return gate
        return self.add(gate, self.mul(cell, self.rows(self.p, k, k + 1, f"P{k}_t{t}"), f"peep{k}", t),
                        f"peeped{k}", t)

    def one_minus(self, sym, tag, t):
        return mx.sym._internal._rminus_scalar(sym, scalar=1.0, name=self.name(tag, t))

    def step(self, xw, h, c, t):
        hid = self.hidden
        if self.kind == "RNN":
            pre = self.add(xw, self.fc(h, self.r, self.rb, hid, self.name("hr", t)), "pre", t)
            return self.act(0, pre, t, "h"), None
        if self.kind == "LSTM":
            pre = self.add(xw, self.fc(h, self.r, self.rb, 4 * hid, self.name("hr", t)), "pre", t)
            gi, go, gf, gc = self.gates(pre, 4, t, "g")
            i = self.act(0, self.peephole(gi, 0, c, t), t, "i")
            f = self.one_minus(i, "f", t) if self.input_forget else self.act(0, self.peephole(gf, 2, c, t), t, "f")
            kept, added = self.mul(f, c, "c_kept", t), self.mul(i, self.act(1, gc, t, "c"), "c_added", t)
            c_new = self.add(kept, added, "c_new", t)
            o = self.act(0, self.peephole(go, 1, c_new, t), t, "o")
            return self.mul(o, _ACTS[self.acts[2]](c_new, self.name("hc", t)), "h_new", t), c_new
        xz, xr, xh = self.gates(xw, 3, t, "x")
        if self.lbr:
            hz, hr, hh = self.gates(self.fc(h, self.r, self.rb, 3 * hid, self.name("hr", t)), 3, t, "h")
            recurrent = self.mul(self.act(0, self.add(xr, hr, "r_pre", t), t, "r"), hh, "r_hh", t)
        else:
            (r_zr, rb_zr), (r_h, rb_h) = self.reset_split
            hz, hr = self.gates(self.fc(h, r_zr, rb_zr, 2 * hid, self.name("hr", t)), 2, t, "h")
            reset_h = self.mul(self.act(0, self.add(xr, hr, "r_pre", t), t, "r"), h, "r_h", t)
            recurrent = self.fc(reset_h, r_h, rb_h, hid, self.name("rh", t))
        z = self.act(0, self.add(xz, hz, "z_pre", t), t, "z")
        n = self.act(1, self.add(xh, recurrent, "n_pre", t), t, "n")
        blend = self.mul(self.one_minus(z, "1-z", t), n, "z_n", t)
        return self.add(blend, self.mul(z, h, "z_h", t), "h_new", t), None


def _select(node, mask, new, old, tag):
    """new where mask (N, 1) is 1, else old: old + mask * (new - old)."""
    diff = mx.sym.elemwise_sub(new, old, name=node.sub(f"{tag}_diff"))
    return mx.sym.broadcast_add(old, mx.sym.broadcast_mul(mask, diff, name=node.sub(f"{tag}_masked")),
                                name=node.sub(tag))


def _unrolled(node, kind, x_tnc, steps, w, r, b, p, h0, c0, lens, dirs, hidden, reverse, acts):
    ys, hs, cs = [], [], []
    for d in range(dirs):
        cell = _Unrolled(node, kind, w, r, b, p, d, hidden, acts[d])
        xw = mx.sym.split(cell.input_projection(x_tnc), num_outputs=steps, axis=0, squeeze_axis=True,
                          name=node.sub(f"d{d}_steps"))
        xw = [xw] if steps == 1 else list(xw)
        h = _direction(node, h0, d, "h0_")
        c = None if c0 is None else _direction(node, c0, d, "c0_")
        outs = [None] * steps
        backwards = reverse or d == 1
        for t in (reversed(range(steps)) if backwards else range(steps)):
            h_new, c_new = cell.step(xw[t], h, c, t)
            if lens is None:
                h, c, outs[t] = h_new, c_new, h_new
                continue
            live = mx.sym._internal._greater_scalar(lens, scalar=t, name=cell.name("live", t))
            m = mx.sym.reshape(live, shape=(-1, 1), name=cell.name("mask", t))
            outs[t] = mx.sym.broadcast_mul(m, h_new, name=cell.name("y", t))
            h = _select(node, m, h_new, h, f"d{d}_t{t}_h")
            c = None if c is None else _select(node, m, c_new, c, f"d{d}_t{t}_c")
        ys.append(mx.sym.stack(*outs, axis=0, name=node.sub(f"d{d}_Y")))
        hs.append(h)
        cs.append(c)
    y = mx.sym.stack(*ys, axis=2, name=node.sub("Y_split"))  # (T, N, D, H)
    y_h = mx.sym.stack(*hs, axis=0, name=node.sub("Y_h_dnh"))
    y_c = mx.sym.stack(*cs, axis=0, name=node.sub("Y_c_dnh")) if kind == "LSTM" else None
    return y, y_h, y_c


def _full_length(lens, steps):
    return lens is None or (lens.const is not None and steps is not None and bool(np.all(lens.const == steps)))


def _convert(node, inputs, kind):
    x, w, r = inputs[0], inputs[1], inputs[2]
    b, lens, h0_t = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
    c0_t, p = (_opt(inputs, 6), _opt(inputs, 7)) if kind == "LSTM" else (None, None)
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.unsupported(f"unknown direction '{direction}'")
    dirs = 2 if direction == "bidirectional" else 1
    r_shape = r.shape if r.shape is not None else (None if r.const is None else r.const.shape)
    hidden = node.attr("hidden_size") or (r_shape[-1] if r_shape is not None else None)
    if hidden is None:
        raise node.unsupported("hidden_size is missing and R has no static shape")
    layout = node.attr("layout", 0)
    x_tnc = mx.sym.transpose(x.sym, axes=(1, 0, 2), name=node.sub("X_tnc")) if layout else x.sym
    steps = None if x.shape is None else x.shape[1 if layout else 0]
    if node.attr("activation_alpha") is not None or node.attr("activation_beta") is not None:
        raise node.unsupported("activation_alpha/activation_beta are not supported; use activations with "
                               "default parameters")
    defaults = _CELLS[kind][1]
    names = [a.lower() for a in node.attr("activations", defaults * dirs)]
    per_dir = len(defaults)
    acts = [names[i * per_dir:(i + 1) * per_dir] for i in range(dirs)]
    for a in names:
        if a not in _ACTS:
            raise node.unsupported(f"activation '{a}' is not supported (use one of {sorted(_ACTS)})")
    h0 = _initial_state(node, h0_t, x_tnc, dirs, hidden, layout, "h0")
    c0 = _initial_state(node, c0_t, x_tnc, dirs, hidden, layout, "c0") if kind == "LSTM" else None
    plain_acts = all(a == [d.lower() for d in defaults] for a in acts) or \
        (kind == "RNN" and len({a[0] for a in acts}) == 1 and acts[0][0] in ("tanh", "relu"))
    peephole = p is not None and not (p.const is not None and not np.any(p.const))
    fused = plain_acts and node.attr("clip") is None and not node.attr("input_forget", 0) and not peephole and \
        (kind != "GRU" or node.attr("linear_before_reset", 0)) and _full_length(lens, steps)
    if fused:
        y, y_h, y_c = _fused(node, kind, x_tnc, w.sym, r.sym, None if b is None else b.sym, h0, c0, dirs,
                             hidden, direction == "reverse")
    else:
        if steps is None:
            raise node.unsupported("this variant (GRU linear_before_reset=0, peepholes, clip, non-default "
                                   "activations or shorter sequence_lens) is unrolled over time and needs a "
                                   "static sequence length; pass input_shapes=... when importing")
        lens_sym = None if _full_length(lens, steps) else mx.sym.cast(lens.sym, dtype="float32",
                                                                     name=node.sub("lens"))
        y, y_h, y_c = _unrolled(node, kind, x_tnc, steps, w.sym, r.sym, None if b is None else b.sym,
                                None if p is None else p.sym, h0, c0, lens_sym, dirs, hidden,
                                direction == "reverse", acts)
    # ONNX layouts: Y (T, D, N, H) or (N, T, D, H); states (D, N, H) or (N, D, H).
    y = mx.sym.transpose(y, axes=(1, 0, 2, 3) if layout else (0, 2, 1, 3), name=node.name)
    states = [y_h, y_c] if kind == "LSTM" else [y_h]
    if layout:
        states = [mx.sym.transpose(s, axes=(1, 0, 2), name=node.sub(f"state{i}")) for i, s in enumerate(states)]
    else:
        states = [mx.sym.identity(s, name=node.sub(tag)) for s, tag in zip(states, ("Y_h", "Y_c"))]
    return [s if len(node.outputs) > i and node.outputs[i] else None for i, s in enumerate([y] + states)]


@converter("LSTM", since=1)
def lstm(node, inputs):
    return _convert(node, inputs, "LSTM")


@converter("GRU", since=1)
def gru(node, inputs):
    return _convert(node, inputs, "GRU")


@converter("RNN", since=1)
def rnn(node, inputs):
    return _convert(node, inputs, "RNN")
