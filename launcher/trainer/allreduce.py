"""The gradient exchange: the one place where gradients cross replicas and workers.

Called in replica context with this replica's gradients of loss / global_batch_size;
returns their sum over all replicas, which is the gradient of the global mean loss.
Everything that shapes the communication (method, wire dtype, packing, implementation,
timeout) is decided here, so tuning it touches nothing else.

Two methods:
- allreduce: every gradient is all-reduced.
- factors: for a Dense layer without activation, the kernel gradient summed over replicas
  is X^T @ dY over all replicas' rows, where X are the layer's inputs and dY the
  gradients at its output. When the batch is small next to the kernel, every replica
  all-gathers X and dY (b x (in + out) values) instead of reducing the kernel gradient
  (in x out values) and rebuilds the sum locally with one matmul (replicas x b rows).
  Every other gradient travels flattened in a second all-gather (or, with factor_gather
  "together", in the same one) and is summed locally. Which layers do so: exchange_cost.py
  weighs bytes and the rebuild's compute. With "early", the factors' all-gather needs only
  the factored layers' inputs and output gradients, so TensorFlow's executor may start it
  while the layers below still back-propagate, if it has a thread free for it (with XLA, the
  backward pass is one compiled call and the gather follows it).

Each exchange also says how long this replica waited in its collectives, on the host's clock read
inside the graph right before they start and once they are back: a worker that computes faster
than another waits there for it.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from launcher.trainer import exchange_cost

# float16 has a narrow range: gradients are scaled up before the cast so that small
# ones do not flush to zero, and scaled back after the sum.
FLOAT16_SCALE = 256.0


@dataclasses.dataclass(frozen=True)
class AllReduceSettings:
    wire_dtype: str = "float32"  # allreduce: float32 | float16 | bfloat16
    options: tf.distribute.experimental.CommunicationOptions | None = None
    exchange: str = "auto"  # auto | allreduce | factors
    factor_dtype: str = "int8"  # factors: wire dtype, int8 (a scale per row) | bfloat16 | float32
    factor_gather: str = "together"  # factors: together (one all-gather) | early (own all-gather during back-propagation)
    gpus: int = 0  # GPUs of this worker: the cost model's constants are CPU costs


def clock_after(tensors) -> tf.Tensor:
    """The host's clock (seconds, float64) once every one of `tensors` exists."""
    with tf.control_dependencies([t for t in tf.nest.flatten(tensors) if t is not None]):
        return tf.timestamp()


def _held_until(tensors, op):
    """`tensors`, available only once `op` has run."""
    with tf.control_dependencies([op]):
        return tf.nest.map_structure(tf.identity, tensors)


def allreduce_gradients(grads: list[tf.Tensor], settings: AllReduceSettings) -> list[tf.Tensor]:
    """The gradients summed over replicas."""
    return timed_allreduce_gradients(grads, settings)[0]


def timed_allreduce_gradients(grads: list[tf.Tensor], settings: AllReduceSettings) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The gradients summed over replicas, and the seconds this replica spent in the all-reduce: from
    the moment its own gradients were on the wire's dtype to the moment the sums were back."""
    ctx = tf.distribute.get_replica_context()
    wire = tf.as_dtype(settings.wire_dtype)
    scale = FLOAT16_SCALE if wire == tf.float16 else 1.0
    sent = [g if g.dtype == wire else tf.cast(g * scale if scale != 1.0 else g, wire) for g in grads]
    ready = clock_after(sent)
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, _held_until(sent, ready), options=settings.options)
    waited = clock_after(summed) - ready
    return [s if s.dtype == g.dtype else _unscale(tf.cast(s, g.dtype), scale)
            for s, g in zip(summed, grads)], waited


def _unscale(t: tf.Tensor, scale: float) -> tf.Tensor:
    return t / scale if scale != 1.0 else t


def _linear_dense(layer) -> bool:
    return (isinstance(layer, keras.layers.Dense)
            and layer.activation in (None, keras.activations.linear))


def factored_layers(model: keras.Model, batch_per_replica: int, replicas: int,
                    settings: AllReduceSettings = AllReduceSettings()) -> list:
    """Dense layers whose factors cost a worker less CPU per step than all-reducing their
    kernel gradient: wire bytes and the rebuild's multiply-adds, launcher.trainer.exchange_cost."""
    return [layer for layer in model.layers if _linear_dense(layer) and exchange_cost.factors_cheaper(
        *layer.kernel.shape, batch_per_replica, replicas, allreduce_dtype=settings.wire_dtype,
        factor_dtype=settings.factor_dtype, compute_dtype=layer.compute_dtype)]


def choose_factored_layers(settings: AllReduceSettings, model: keras.Model,
                           batch_per_replica: int, replicas: int) -> list:
    """The layers whose kernel gradients are rebuilt from factors (empty: plain all-reduce).

    `auto` on a worker with GPUs all-reduces every gradient: the cost model weighs bytes against
    CPU multiply-adds, measured on CPUs, and says nothing of NCCL's all-reduce on GPUs.
    """
    if settings.exchange == "allreduce" or (settings.exchange == "auto" and settings.gpus > 0):
        return []
    if settings.exchange == "factors":
        return [layer for layer in model.layers if _linear_dense(layer)]
    return factored_layers(model, batch_per_replica, replicas, settings)


def exchange_gradients(grads: list[tf.Tensor], factors: list[tuple[tf.Tensor, tf.Tensor]],
                       settings: AllReduceSettings) -> tuple[list[tf.Tensor], list[tf.Tensor], tf.Tensor]:
    """All-gathers of this replica's gradients and (inputs, output gradients) pairs.

    Returns the gradients summed over replicas and, per pair, the kernel gradient summed
    over replicas, all float32, and the seconds this replica waited for the all-gathers: from
    the moment everything it sends was packed to the moment the last all-gather was back (the
    rebuild after it is its own work). With factor_gather "early" the factors travel in an all-gather
    of their own, which needs nothing but the factored layers' output gradients, so it can
    start while the layers below are still back-propagating; the other gradients follow in a
    second one. With "together" one all-gather carries everything after the backward pass.
    """
    ctx = tf.distribute.get_replica_context()
    replicas = ctx.num_replicas_in_sync
    factor_wire = settings.factor_dtype
    # int8 is for factors only (a scale per row); the other gradients travel as bfloat16.
    other_wire = "bfloat16" if factor_wire == "int8" else factor_wire
    factor_pack = _Pack(replicas)
    for x, dy in factors:
        factor_pack.add_rows(x, dy, factor_wire)
    other_pack = factor_pack if settings.factor_gather == "together" else _Pack(replicas)
    for g in grads:
        other_pack.add(g, other_wire)
    packs = [factor_pack] if other_pack is factor_pack else [factor_pack, other_pack]
    flats = [pack.flat() for pack in packs]
    ready = clock_after(flats)
    # The last all-gather starts once the clock is read; "early" factors' own one need not wait.
    flats[-1] = None if flats[-1] is None else _held_until(flats[-1], ready)
    gathered = [_gather(ctx, flat, settings.options) for flat in flats]
    waited = clock_after(gathered) - ready
    rows = [pack.unpack(g) for pack, g in zip(packs, gathered)]
    factor_rows, other_rows = rows[0], rows[-1]
    kernel_grads = [tf.cast(_rebuild(*rows), tf.float32) for rows in factor_rows[:len(factors)]]
    summed = [tf.reshape(tf.reduce_sum(rows, axis=0), g.shape)
              for rows, g in zip(other_rows[len(other_rows) - len(grads):], grads)]
    return summed, kernel_grads, waited


def _gather(ctx, flat: tf.Tensor | None, options) -> tf.Tensor | None:
    return None if flat is None else ctx.all_gather(flat, axis=0, options=options)


def _rebuild(xs: tf.Tensor, dys: tf.Tensor, scales: tf.Tensor | None) -> tf.Tensor:
    """The kernel gradient summed over replicas: X^T dY over every replica's rows. bfloat16
    factors stay bfloat16 in the matmul (AMX where the CPU has it); int8 ones become bfloat16
    exactly, with each row's two scales folded into dY's row."""
    if scales is not None:
        dys = tf.cast(tf.cast(dys, tf.float32) * scales[:, None], tf.bfloat16)
        xs = tf.cast(xs, tf.bfloat16)
    return tf.matmul(xs, dys, transpose_a=True)


class _Pack:
    """Tensors laid end to end in one vector of 16-bit words for one all-gather (which only
    copies bytes: any dtype travels bitcast), and unpacked from the gathered [replicas, words].

    Entries are a factored layer's (inputs, output gradients) rows (unpacked as every replica's
    rows stacked, with int8 each row's combined scale) or one tensor (unpacked as
    [replicas, values] float32, for summing)."""

    def __init__(self, replicas: int):
        self.replicas = replicas
        self.words: list[tf.Tensor] = []
        self.entries: list = []  # per entry: a function of its words' columns -> unpacked

    def _put(self, words: tf.Tensor) -> int:
        self.words.append(words)
        return len(self.words) - 1

    def add(self, tensor: tf.Tensor, wire: str) -> None:
        i = self._put(_to_words(tf.reshape(tensor, [-1]), wire))
        n = tensor.shape.num_elements()
        self.entries.append(lambda cols: tf.cast(_from_words(cols[i], wire, n), tf.float32))

    def add_rows(self, x: tf.Tensor, dy: tf.Tensor, wire: str) -> None:
        b = x.shape[0]
        rows = self.replicas * b
        if wire != "int8":
            ix, idy = self._put(_to_words(tf.reshape(x, [-1]), wire)), self._put(_to_words(tf.reshape(dy, [-1]), wire))
            self.entries.append(lambda cols: (
                tf.reshape(_from_words(cols[ix], wire, x.shape.num_elements()), [rows, x.shape[1]]),
                tf.reshape(_from_words(cols[idy], wire, dy.shape.num_elements()), [rows, dy.shape[1]]),
                None))
            return
        qx, sx = _quantize_rows(x)
        qdy, sdy = _quantize_rows(dy)
        ix, idy = self._put(_int8_words(qx)), self._put(_int8_words(qdy))
        iscale = self._put(_to_words(sx * sdy, "float32"))
        self.entries.append(lambda cols: (
            tf.reshape(_int8_from_words(cols[ix], qx.shape.num_elements()), [rows, x.shape[1]]),
            tf.reshape(_int8_from_words(cols[idy], qdy.shape.num_elements()), [rows, dy.shape[1]]),
            tf.reshape(_from_words(cols[iscale], "float32", b), [rows])))

    def flat(self) -> tf.Tensor | None:
        """What the all-gather sends: every entry's words end to end (None when there are none)."""
        return tf.concat(self.words, 0) if self.words else None

    def unpack(self, gathered: tf.Tensor | None) -> list:
        """Each entry unpacked from the all-gather of `flat()`, in the order added."""
        if gathered is None:
            return []
        sizes = [w.shape.num_elements() for w in self.words]
        cols = tf.split(tf.reshape(gathered, [self.replicas, sum(sizes)]), sizes, axis=1)  # row r: replica r
        return [entry(cols) for entry in self.entries]


def _to_words(flat: tf.Tensor, wire: str) -> tf.Tensor:
    """A 1-D tensor in `wire` dtype as float16 words: the all-gather has no bfloat16 kernel."""
    t = tf.cast(flat, wire)
    if wire == "float32":
        return tf.reshape(tf.bitcast(t, tf.float16), [-1])
    return tf.bitcast(t, tf.float16)


def _from_words(cols: tf.Tensor, wire: str, n: int) -> tf.Tensor:
    """[replicas, words] back to [replicas, n] values of `wire` dtype."""
    if wire == "float32":
        return tf.bitcast(tf.reshape(cols, [-1, n, 2]), tf.float32)
    return tf.bitcast(cols, tf.as_dtype(wire))


def _quantize_rows(t: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """int8 values and a float32 scale per row: row = values x scale, to 1/254 of its largest |value|."""
    t = tf.cast(t, tf.float32)
    scale = tf.reduce_max(tf.abs(t), axis=1) / 127.0
    q = tf.cast(tf.clip_by_value(tf.round(tf.math.divide_no_nan(t, scale[:, None])), -127.0, 127.0), tf.int8)
    return q, scale


def _int8_words(q: tf.Tensor) -> tf.Tensor:
    flat = tf.reshape(q, [-1])
    if flat.shape[0] % 2:
        flat = tf.concat([flat, tf.zeros([1], tf.int8)], 0)
    return tf.bitcast(tf.reshape(flat, [-1, 2]), tf.float16)


def _int8_from_words(cols: tf.Tensor, n: int) -> tf.Tensor:
    """[replicas, words] back to [replicas, n] int8."""
    return tf.reshape(tf.bitcast(cols, tf.int8), [cols.shape[0], -1])[:, :n]


def describe_exchange(settings: AllReduceSettings, factored: list) -> str:
    """One line for the log, e.g. 'factors bfloat16 (dense 3136x1024), early all-gather'."""
    if not factored:
        return f"allreduce {settings.wire_dtype}"
    shapes = ", ".join("x".join(str(n) for n in layer.kernel.shape) for layer in factored)
    return f"factors {settings.factor_dtype} (dense {shapes}), {settings.factor_gather} all-gather"
