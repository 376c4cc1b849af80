"""Which Dense kernels travel as factors: a cost model in CPU seconds per step and worker.

Every worker must choose the same layers (workers that disagreed would wait forever in
mismatched collectives), so the choice is pure arithmetic on shapes, the replica count and the
constants below; nothing is timed at start-up. No TensorFlow here.

For a Dense kernel of in x out, b examples per replica and R replicas, what differs between the
two exchanges (launcher/trainer/steps.py and allreduce.py) is:
- all-reduce: the tape computes this replica's kernel gradient X^T dY (b x in x out
  multiply-adds in the layer's compute dtype), and the ring all-reduce brings about
  2 (R-1)/R x in x out values of the all-reduce dtype to each worker (and sums them).
- factors: the tape skips the kernel gradient (nothing asks for it); the all-gather brings
  (R-1) x b x (in + out) values of the factor dtype to each worker (int8: and a scale per row),
  which rebuilds the summed kernel gradient with one matmul of R x b x in x out multiply-adds
  (bfloat16 for int8 factors), then casts it (in x out values) to float32 when that dtype is not
  float32. int8's quantizing (a few passes over b x (in + out) values) is not counted.
Both paths back-propagate dY to the layer's input alike, and the other gradients cost about the
same either way, so neither is counted. The per-call cost of a collective is paid once per step
by both paths (one all-reduce or one all-gather; two with --factor-gather early, a small
difference), so only costs per byte are counted.

The model counts CPU time, not wall time: with one worker per core there is no idle core to
hide communication in, and the collective's CPU is what a step waits for. Where cores are spare
(fewer workers than cores) communication partly overlaps the compute and the rebuild, on the
compute thread, weighs relatively more; the model then favours factors slightly too long.
"""

from __future__ import annotations

import dataclasses

BYTES_PER_VALUE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
SCALE_BYTES = 4  # int8 factors: one float32 scale per row (both factors' scales multiplied)


@dataclasses.dataclass(frozen=True)
class CostConstants:
    allreduce_s_per_byte: float  # CPU s per byte an all-reduce brings to a worker
    allgather_s_per_byte: float  # CPU s per byte an all-gather brings to a worker
    float32_s_per_mac: float  # one-thread matmul, per multiply-add
    bfloat16_s_per_mac: float
    cast_s_per_value: float  # bfloat16 -> float32

    def s_per_mac(self, dtype: str) -> float:
        # float16 matmuls on CPU run no faster than float32 ones; int8 factors are rebuilt in bfloat16.
        return self.bfloat16_s_per_mac if dtype in ("bfloat16", "int8") else self.float32_s_per_mac


# Measured with `nice python benchmarks/exchange_costs.py --repeats 5` (CPU seconds of every
# thread; 2 workers on 127.0.0.1, one intra-op and one inter-op thread each; TF 2.21, oneDNN on)
# on a 2-core AMD EPYC with AVX-512 BF16, 2026-11-23, three runs:
# - all-reduce 1.9 ms and all-gather 1.6 ms of CPU per MB a worker receives (slopes over
#   3.3-13.1 MB float32 all-reduces and 1.1-4.4 MB 16-bit all-gathers); bfloat16 and float16
#   all-reduces cost about the same per byte (1.7-2.0 ns), so one constant serves every dtype;
# - one-thread matmuls X^T dY with in x out = 3136 x 1024: float32 at 128 rows 25.7 ps per
#   multiply-add; bfloat16 at 256-1024 rows 11.4-12.8 ps; the bfloat16 -> float32 cast of
#   the kernel gradient 0.31 ns per value.
# CPUs with AMX make bfloat16 matmuls cheaper still, which moves the switch to more replicas.
MEASURED = CostConstants(
    allreduce_s_per_byte=1.9e-9,
    allgather_s_per_byte=1.6e-9,
    float32_s_per_mac=25.7e-12,
    bfloat16_s_per_mac=12.0e-12,
    cast_s_per_value=0.31e-9,
)


@dataclasses.dataclass(frozen=True)
class PathCost:
    wire_bytes: float  # received per worker and step
    wire_s: float
    matmul_s: float
    cast_s: float

    @property
    def total_s(self) -> float:
        return self.wire_s + self.matmul_s + self.cast_s


def allreduce_cost(n_in: int, n_out: int, batch: int, replicas: int, allreduce_dtype: str = "float32",
                   compute_dtype: str = "float32", c: CostConstants = MEASURED) -> PathCost:
    wire = 2 * (replicas - 1) / replicas * n_in * n_out * BYTES_PER_VALUE[allreduce_dtype]
    return PathCost(wire, wire * c.allreduce_s_per_byte,
                    batch * n_in * n_out * c.s_per_mac(compute_dtype), 0.0)


def factors_cost(n_in: int, n_out: int, batch: int, replicas: int, factor_dtype: str = "int8",
                 c: CostConstants = MEASURED) -> PathCost:
    wire = (replicas - 1) * batch * ((n_in + n_out) * BYTES_PER_VALUE[factor_dtype]
                                     + (SCALE_BYTES if factor_dtype == "int8" else 0))
    cast = 0.0 if factor_dtype == "float32" else n_in * n_out * c.cast_s_per_value
    return PathCost(wire, wire * c.allgather_s_per_byte,
                    replicas * batch * n_in * n_out * c.s_per_mac(factor_dtype), cast)


def factors_cheaper(n_in: int, n_out: int, batch: int, replicas: int, *, allreduce_dtype: str = "float32",
                    factor_dtype: str = "int8", compute_dtype: str = "float32",
                    c: CostConstants = MEASURED) -> bool:
    """Whether exchanging factors costs a worker less CPU per step than all-reducing the kernel."""
    if replicas < 2:
        return False
    return (factors_cost(n_in, n_out, batch, replicas, factor_dtype, c).total_s
            < allreduce_cost(n_in, n_out, batch, replicas, allreduce_dtype, compute_dtype, c).total_s)


def markdown_table(n_in: int, n_out: int, batch: int, replica_counts, c: CostConstants = MEASURED,
                   allreduce_dtype: str = "float32", factor_dtype: str = "int8") -> str:
    """Both paths' modelled costs per replica count, in ms of CPU per step and worker."""
    lines = [f"| R | all-reduce {allreduce_dtype}: MB in, wire + local matmul = ms "
             f"| factors {factor_dtype}: MB in, wire + rebuild + cast = ms | chosen |",
             "|---|---|---|---|"]
    for r in replica_counts:
        a = allreduce_cost(n_in, n_out, batch, r, allreduce_dtype, c=c)
        f = factors_cost(n_in, n_out, batch, r, factor_dtype, c)
        chosen = "factors" if factors_cheaper(n_in, n_out, batch, r, allreduce_dtype=allreduce_dtype,
                                              factor_dtype=factor_dtype, c=c) else "all-reduce"
        lines.append(f"| {r} | {a.wire_bytes / 1e6:.1f}, {1e3 * a.wire_s:.1f} + {1e3 * a.matmul_s:.1f} "
                     f"= **{1e3 * a.total_s:.1f}** | {f.wire_bytes / 1e6:.1f}, {1e3 * f.wire_s:.1f} + "
                     f"{1e3 * f.matmul_s:.1f} + {1e3 * f.cast_s:.1f} = **{1e3 * f.total_s:.1f}** | {chosen} |")
    return "\n".join(lines) + "\n"
