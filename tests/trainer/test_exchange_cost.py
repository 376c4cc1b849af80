"""The exchange cost model: pure arithmetic, so every worker chooses the same layers."""

import subprocess
import sys

import pytest

from launcher.trainer import exchange_cost
from launcher.trainer.exchange_cost import CostConstants, allreduce_cost, factors_cheaper, factors_cost

BIG = (3136, 1024)  # the seed CNN's big Dense layer
# Round constants, so the expected figures below can be checked by hand.
ROUND = CostConstants(allreduce_s_per_byte=2e-9, allgather_s_per_byte=1e-9, float32_s_per_mac=20e-12,
                      bfloat16_s_per_mac=10e-12, cast_s_per_value=1e-9)


def test_costs_count_wire_bytes_and_multiply_adds():
    a = allreduce_cost(100, 50, 8, 4, c=ROUND)
    assert a.wire_bytes == pytest.approx(2 * 3 / 4 * 100 * 50 * 4)
    assert a.matmul_s == pytest.approx(8 * 100 * 50 * 20e-12)  # the local kernel gradient
    assert a.total_s == pytest.approx(a.wire_bytes * 2e-9 + a.matmul_s)
    f = factors_cost(100, 50, 8, 4, "bfloat16", c=ROUND)
    assert f.wire_bytes == 3 * 8 * 150 * 2
    assert f.matmul_s == pytest.approx(4 * 8 * 100 * 50 * 10e-12)  # the rebuild over R x b rows
    assert f.cast_s == pytest.approx(100 * 50 * 1e-9)
    q = factors_cost(100, 50, 8, 4, "int8", c=ROUND)  # a float32 scale per row travels too
    assert q.wire_bytes == 3 * 8 * (150 + 4) and q.matmul_s == f.matmul_s and q.cast_s == f.cast_s
    f32 = factors_cost(100, 50, 8, 4, "float32", c=ROUND)
    assert f32.wire_bytes == 2 * f.wire_bytes and f32.cast_s == 0.0
    assert f32.matmul_s == pytest.approx(2 * f.matmul_s)
    # A 16-bit all-reduce halves the bytes; a bfloat16 layer's own kernel gradient costs less.
    assert allreduce_cost(100, 50, 8, 4, "bfloat16", c=ROUND).wire_bytes == a.wire_bytes / 2
    assert allreduce_cost(100, 50, 8, 4, compute_dtype="bfloat16", c=ROUND).matmul_s == a.matmul_s / 2


def test_one_replica_never_factors():
    assert not factors_cheaper(*BIG, 1, 1)
    assert not factors_cheaper(*BIG, 128, 1, c=ROUND)


def test_the_seed_cnn_at_128_per_replica_factors_up_to_9_replicas_with_the_measured_constants():
    chosen = [r for r in range(2, 17) if factors_cheaper(*BIG, 128, r)]
    assert chosen == list(range(2, 10))
    # bfloat16 factors carry twice int8's bytes: up to 8 replicas.
    assert [r for r in range(2, 17) if factors_cheaper(*BIG, 128, r, factor_dtype="bfloat16")] == list(range(2, 9))
    # Float32 factors double the wire and the rebuild: they pay off at 2-3 replicas only.
    assert [r for r in range(2, 17) if factors_cheaper(*BIG, 128, r, factor_dtype="float32")] == [2, 3]
    # The small output layer's kernel (1024 x 10) is cheaper to all-reduce at this batch.
    assert not any(factors_cheaper(1024, 10, 128, r) for r in range(2, 17))


def test_the_rebuild_outweighs_the_wire_as_batch_or_replicas_grow():
    # The rebuild grows as R x b while the all-reduce's bytes stay near 2 x in x out.
    # (At 2 replicas int8 factors stay cheaper up to about 16,000 rows per replica.)
    for r in (2, 4, 8, 16):
        switch = next(b for b in range(1, 1 << 16) if not factors_cheaper(*BIG, b, r))
        assert all(factors_cheaper(*BIG, b, r) for b in range(1, switch))
    largest = [next(b for b in range(1, 1 << 16) if not factors_cheaper(*BIG, b, r)) for r in (2, 4, 8, 16)]
    assert largest == sorted(largest, reverse=True) and largest[0] > 128 > largest[-1]


def test_the_rule_is_the_same_arithmetic_everywhere():
    """A fresh interpreter (another worker) gets exactly the same choices: no timing, no state."""
    grid = [(b, r) for b in (16, 64, 128, 256, 512) for r in range(1, 17)]
    here = [factors_cheaper(*BIG, b, r) for b, r in grid]
    code = ("from launcher.trainer.exchange_cost import factors_cheaper as f; "
            f"print([f(3136, 1024, b, r) for b, r in {grid!r}])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == str(here)


def test_the_cost_model_imports_no_tensorflow():
    code = ("import sys; import launcher.trainer.exchange_cost; "
            "print([m for m in ('tensorflow', 'keras', 'numpy') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_table_marks_the_choice_per_replica_count():
    table = exchange_cost.markdown_table(*BIG, 128, [2, 9, 10, 16])
    rows = table.splitlines()[2:]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["factors", "factors", "all-reduce", "all-reduce"]
