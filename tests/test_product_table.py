"""benchmarks.product_table: matrix products by shape class against the matmul ceiling."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import product_table, profile_training


@pytest.fixture
def table():
    return product_table


def event(key: str, shapes: list, microseconds: float, count: int = 1):
    return SimpleNamespace(key=key, input_shapes=shapes, self_cpu_time_total=microseconds,
                           count=count)


def test_batch_dimensions_merge_into_one_class_with_their_flop(table):
    """Two batch sizes of the output layer's forward are one class; its weight gradient and a
    non-product operator are not in it."""
    events = [
        event("aten::addmm", [[40], [100, 8], [8, 40], [], []], 2e6, count=2),
        event("aten::addmm", [[40], [50, 8], [8, 40], [], []], 1e6),
        event("aten::mm", [[40, 100], [100, 8]], 1e6),
        event("aten::sigmoid_", [[100, 40]], 4e6),
    ]
    classes, total = table.product_classes(events, fixed_dims={8, 40})
    assert total == pytest.approx(8.0)
    by_label = {found.label: found for found in classes}
    assert set(by_label) == {"(n, 8) x (8, 40)", "(40, n) x (n, 8)"}
    forward = by_label["(n, 8) x (8, 40)"]
    assert forward.calls == 3
    assert forward.seconds == pytest.approx(3.0)
    assert forward.flop == 2 * 8 * 40 * (2 * 100 + 50)
    assert forward.mean_n == pytest.approx((2 * 100 + 50) / 3)
    assert classes[0] is forward  # slowest first


def test_batched_and_matrix_vector_products(table):
    """bmm and baddbmm (the added tensor first) count their batch; mv and addmv have N = 1."""
    assert table.product_dims("aten::bmm", [[4, 3, 5], [4, 5, 7]]) == (4, 3, 5, 7)
    assert table.product_dims("aten::baddbmm", [[4, 3, 7], [4, 3, 5], [4, 5, 7], [], []]) == (
        4, 3, 5, 7)
    assert table.product_dims("aten::addmv", [[3], [3, 5], [5], [], []]) == (1, 3, 5, 1)
    assert table.product_dims("aten::mv", [[3, 5], [5]]) == (1, 3, 5, 1)
    assert table.product_dims("aten::add", [[3, 5], [3, 5]]) is None
    events = [event("aten::baddbmm", [[4, 3, 7], [4, 3, 5], [4, 5, 7], [], []], 1.0),
              event("aten::addmv", [[3], [3, 5], [5], [], []], 1.0)]
    classes, _ = table.product_classes(events, {5})
    by_label = {found.label: found for found in classes}
    assert by_label["bmm n x (n, 5) x (5, n)"].flop == 2 * 4 * 3 * 5 * 7
    assert by_label["(n, 5) x (5)"].flop == 2 * 3 * 5
    assert by_label["(n, 5) x (5)"].mean_n == 3


def test_report_shares_and_ceiling(table):
    events = [event("aten::mm", [[10**6, 500], [500, 400]], 4e6),
              event("aten::add", [[1]], 1e6)]
    report = table.product_report(events, fixed_dims={500, 400}, ceiling=200.0)
    row = report.splitlines()[1].split()  # (n, 500) x (500, 400): 400 GFLOP in 4 s
    assert row[-2:] == ["100.0", "50%"]  # GFLOP/s, % of the 200 GFLOP/s ceiling
    assert report.splitlines()[-1] == (
        "all products: 4.00 s of 5.00 s of operator time (80%) at 100.0 GFLOP/s = 50% of the "
        "ceiling (200); everything else 1.00 s (20%)")
    unmeasured = table.product_report(events, fixed_dims=set(), ceiling=None)
    assert "of the ceiling" not in unmeasured.splitlines()[-1]


def test_profiles_without_products_or_time(table):
    """A profile with no products, or no operator time at all, reports so instead of failing."""
    no_products = table.product_report([event("aten::add", [[1]], 1e6)], fixed_dims=set(),
                                       ceiling=60.0)
    assert no_products.splitlines()[-1] == "no matrix products among 1.00 s of operator time"
    summary = table.product_summary([], 1.0, 60.0)
    assert summary["product_share"] == 0 and summary["product_percent_of_ceiling"] is None
    assert "nothing to report" in table.product_report([], fixed_dims=set(), ceiling=60.0)
    assert table.product_summary([], 0.0, 60.0)["product_share"] == 0.0


def test_a_real_profile_names_the_layer_by_its_parameter_sizes(table):
    layer = torch.nn.Linear(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        layer(torch.randn(3, 8))
        layer(torch.randn(5, 8))
    report = table.product_report(profiler.key_averages(group_by_input_shape=True),
                                  fixed_dims=table.parameter_dims(layer), ceiling=None)
    row = next(line for line in report.splitlines() if line.startswith("(n, 8) x (8, 16)"))
    assert row.split()[5] == "2"  # both batch sizes in one class: 2 calls


def test_print_products_writes_the_summary_against_a_given_ceiling(table, tmp_path, capsys):
    """A given ceiling is not measured again (``make bench`` passes its own)."""
    layer = torch.nn.Linear(64, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        layer(torch.randn(128, 64))
    summary = table.print_products(profiler.key_averages(group_by_input_shape=True), layer,
                                   "fp32", ceiling=1000.0, json_path=tmp_path / "p.json")
    assert "matmul ceiling" not in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text()) == summary
    assert 0 < summary["product_share"] <= 1
    assert summary["product_percent_of_ceiling"] == pytest.approx(
        summary["product_gflops"] / 10)


def test_profile_training_reports_products_of_a_preset(tmp_path, monkeypatch, capsys):
    """benchmarks.profile_training --json on a shrunken like-for-like preset, in process."""
    output = tmp_path / "products.json"
    monkeypatch.setattr(sys, "argv", [
        "profile_training.py", "experiment=multi30k_gru_additive", "model.embed_dim=8",
        "model.encoder.hidden_size=8", "model.decoder.hidden_size=16", "batch.max_tokens=60",
        "--steps", "1", "--rows", "1", "--ceiling", "50", "--json", str(output)])
    profile_training.main()
    summary = json.loads(output.read_text())
    assert summary["ceiling_gflops"] == 50.0
    assert 0 < summary["product_seconds"] < summary["total_seconds"]
    assert "x (16, 4288)" in capsys.readouterr().out  # the output layer
