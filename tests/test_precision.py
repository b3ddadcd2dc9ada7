"""seq2seq/precision.py: precision=auto on a CPU decided by a cached measurement of bf16
against fp32 on the work itself (a workload). Every timing here is injected; none is measured
or asserted."""

from __future__ import annotations

import datetime
import json
import logging
import math

import pytest
import torch

import seq2seq.precision
from seq2seq.device import choose_precision
from seq2seq.precision import (
    CACHE_DIR_ENV,
    DEFAULT_SHAPES,
    MAX_ROWS,
    MAX_WIDTH,
    MIN_ROWS,
    CpuIdentity,
    ProbeTimes,
    Workload,
    choose_cpu_precision,
    default_cache_path,
    measure_products,
    model_description,
    probe_products,
    product_workload,
    time_alternately,
)

CPU = torch.device("cpu")
HERE = CpuIdentity("Test CPU 9000", 2, "2.13.0")
DAY = datetime.date(2026, 11, 27)


STEP = "the training step of Seq2Seq 7.1 M parameters [abcdef] on 1,600-token batches"


class FakeProbe:
    """A timing function giving bf16 ``speedup`` times fp32's speed, counting its calls: as a
    workload's (no arguments) or as the products probe's (shapes and rows)."""

    def __init__(self, speedup: float):
        self.speedup = speedup
        self.calls: list[tuple] = []

    def __call__(self, *arguments) -> ProbeTimes:
        self.calls.append(tuple(tuple(argument) if isinstance(argument, list) else argument
                                for argument in arguments))
        return ProbeTimes(fp32_seconds=0.010, bf16_seconds=0.010 / self.speedup)


def choose(probe, cache_path, identity=HERE, name=STEP):
    return choose_cpu_precision(Workload(name, probe), cache_path=cache_path,
                                identity=identity, today=DAY)


@pytest.mark.parametrize(("speedup", "expected"),
                         [(1.6, "bf16"), (1.03, "bf16"), (1.02, "fp32"), (0.6, "fp32")])
def test_bf16_where_the_work_itself_runs_at_least_three_percent_faster(tmp_path, speedup,
                                                                        expected):
    """Never under 97 % of the faster mode: fp32 (exact) only where bf16 gains under 3 %."""
    choice = choose(FakeProbe(speedup), tmp_path / "precision.json")
    assert choice.precision == expected
    assert math.isclose(choice.speedup, speedup)
    assert not choice.from_cache and choice.measured == "2026-11-27"


@pytest.mark.parametrize(("speedup", "expected"), [(1.10, "bf16"), (1.05, "fp32")])
def test_the_products_fallback_asks_ten_percent(tmp_path, speedup, expected):
    """Products alone say less about a step than the step: they need a wider margin."""
    probe = FakeProbe(speedup)
    choice = choose_cpu_precision(product_workload(measure=probe),
                                  cache_path=tmp_path / "precision.json", identity=HERE, today=DAY)
    assert choice.precision == expected and choice.workload.startswith("matrix products 32x512")


def test_the_measurement_is_cached_and_reused(tmp_path):
    path = tmp_path / "cache" / "precision.json"  # the folder is made
    probe = FakeProbe(1.6)
    first = choose(probe, path)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["format"] == 2
    entry = saved["measurements"][f"{HERE.key} | {STEP}"]
    assert entry["cpu"] == "Test CPU 9000" and entry["threads"] == 2
    assert entry["torch"] == "2.13.0" and entry["precision"] == "bf16"
    assert entry["measured"] == "2026-11-27" and math.isclose(entry["speedup"], 1.6)
    assert entry["workload"] == STEP and entry["fp32_ms"] == 10.0
    assert not [name for name in path.parent.iterdir() if name != path]  # no temporary left

    again = choose(probe, path)
    assert len(probe.calls) == 1  # not measured a second time
    assert again.from_cache and again.precision == first.precision == "bf16"
    assert again.measured == "2026-11-27" and again.probe_seconds is None


@pytest.mark.parametrize("other", [CpuIdentity("Test CPU 9000", 1, "2.13.0"),
                                   CpuIdentity("Test CPU 9000", 2, "2.14.0"),
                                   CpuIdentity("Other CPU 42", 2, "2.13.0"),
                                   CpuIdentity("Test CPU 9000", 2, "2.13.0", "0123456789ab")])
def test_another_cpu_its_flags_thread_count_or_torch_version_measure_again(tmp_path, other):
    path = tmp_path / "precision.json"
    choose(FakeProbe(1.6), path)
    probe = FakeProbe(0.6)
    assert choose(probe, path, identity=other).precision == "fp32"
    assert len(probe.calls) == 1
    measurements = json.loads(path.read_text(encoding="utf-8"))["measurements"]
    assert {key: entry["precision"] for key, entry in measurements.items()} == {
        f"{HERE.key} | {STEP}": "bf16", f"{other.key} | {STEP}": "fp32"}  # both kept
    assert choose(probe, path).precision == "bf16" and len(probe.calls) == 1


def test_each_workload_is_measured_and_kept_apart(tmp_path):
    """The Transformer's step may pay in bf16 where the GRU's does not, on one CPU."""
    path = tmp_path / "precision.json"
    choose(FakeProbe(1.4), path)
    gru = STEP.replace("7.1 M parameters [abcdef]", "9.4 M parameters [123456]")
    probe = FakeProbe(0.96)
    assert choose(probe, path, name=gru).precision == "fp32" and len(probe.calls) == 1
    assert choose(probe, path).precision == "bf16" and len(probe.calls) == 1


def test_a_cache_of_the_products_only_version_is_measured_again_quietly(tmp_path, caplog):
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({"format": 1, "measurements": {HERE.key: {"speedup": 1.6}}}),
                    encoding="utf-8")
    probe = FakeProbe(0.9)
    with caplog.at_level(logging.WARNING, logger="seq2seq.precision"):
        assert choose(probe, path).precision == "fp32"
    assert len(probe.calls) == 1 and not caplog.records
    assert json.loads(path.read_text(encoding="utf-8"))["format"] == 2


def test_cpus_of_one_model_name_but_other_flags_are_told_apart(monkeypatch):
    """Virtual machines report "AMD EPYC" for EPYCs with and without bf16 instructions."""
    flags = {"flags": "fpu sse avx2 fma", "model name": "AMD EPYC"}
    monkeypatch.setattr(seq2seq.precision, "_cpuinfo",
                        lambda *fields: next((flags[f] for f in fields if f in flags), None))
    avx2 = CpuIdentity.current()
    flags["flags"] = "fma avx2 sse fpu"  # the same flags in another order
    assert CpuIdentity.current() == avx2 and avx2.cpu == "AMD EPYC" and avx2.features
    flags["flags"] = "fpu sse avx2 fma avx512f avx512_bf16"
    assert CpuIdentity.current().key != avx2.key
    del flags["flags"]  # a kernel that lists none
    assert CpuIdentity.current().features == ""


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", '{"format": 99, "measurements": {}}', '{"format": 2}',
    b"\xff\xfe\x00binary",
])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
    path = tmp_path / "precision.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    probe = FakeProbe(0.6)
    with caplog.at_level(logging.WARNING, logger="seq2seq.precision"):
        assert choose(probe, path).precision == "fp32"
    assert len(probe.calls) == 1
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert f"precision cache {path}" in caplog.records[0].getMessage()
    assert f"{HERE.key} | {STEP}" in json.loads(path.read_text(encoding="utf-8"))["measurements"]


def test_an_unreadable_entry_is_measured_again(tmp_path, caplog):
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({"format": 2, "measurements": {
        f"{HERE.key} | {STEP}": {"speedup": "fast"}}}), encoding="utf-8")
    probe = FakeProbe(1.6)
    with caplog.at_level(logging.WARNING, logger="seq2seq.precision"):
        assert choose(probe, path).precision == "bf16"
    assert len(probe.calls) == 1 and "unreadable" in caplog.text


def test_a_cache_folder_that_cannot_be_written_still_decides(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    path = blocker / "seq2seq" / "precision.json"  # a folder under a file: never writable
    probe = FakeProbe(1.6)
    choice = choose(probe, path)
    assert choice.precision == "bf16" and choice.cache_path is None
    assert choice.cache_error is not None
    assert choose(probe, path).precision == "bf16" and len(probe.calls) == 2  # not cached
    reason = choice.describe()
    assert "\n" not in reason and ", not cached: " in reason


def test_the_log_line_says_what_auto_chose_and_why_in_one_line(tmp_path, monkeypatch, caplog):
    """The lines of a run that measures, a run that reads the cache, and a decoder."""
    monkeypatch.setattr(seq2seq.precision.CpuIdentity, "current", classmethod(lambda cls: HERE))
    monkeypatch.setattr("seq2seq.device.onednn_half_precision_kernels",
                        lambda: {"bf16": True, "fp16": False})
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the path is shown as it is
    log = logging.getLogger("test.precision")
    step = Workload(STEP, FakeProbe(0.6))
    with caplog.at_level(logging.INFO, logger="test.precision"):
        assert choose_precision("auto", CPU, log=log, option="trainer.precision",
                                workload=step) == "fp32"
        assert choose_precision("auto", CPU, log=log, workload=step) == "fp32"
        assert choose_precision("fp32", CPU, log=log, workload=step) == "fp32"  # nothing to say
    measured, cached = [record.getMessage() for record in caplog.records]
    assert measured.startswith(
        f"trainer.precision=auto -> fp32 (bf16 0.60x fp32 on this CPU for {STEP}, measured now in ")
    assert measured.endswith(f" s, cached in {tmp_path / 'precision.json'})")
    today = datetime.date.today().isoformat()
    assert cached == (f"precision=auto -> fp32 (bf16 0.60x fp32 on this CPU for {STEP}, "
                      f"measured {today}, cached in {tmp_path / 'precision.json'})")
    assert "\n" not in measured + cached


def test_the_cache_path_shown_under_home_starts_with_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".cache" / "seq2seq" / "precision.json"
    choice = choose(FakeProbe(1.62), path)
    assert choice.describe() == (f"bf16 1.62x fp32 on this CPU for {STEP}, measured now in "
                                 f"{choice.probe_seconds:.2f} s, cached in "
                                 "~/.cache/seq2seq/precision.json")
    assert choose(FakeProbe(1.62), path).describe() == (
        f"bf16 1.62x fp32 on this CPU for {STEP}, measured 2026-11-27, cached in "
        "~/.cache/seq2seq/precision.json")


def test_the_cache_folder_is_the_override_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_path() == tmp_path / "home" / ".cache" / "seq2seq" / "precision.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "seq2seq" / "precision.json"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert default_cache_path() == tmp_path / "mine" / "precision.json"


def test_the_products_fallback_multiplies_the_shapes_it_is_given(tmp_path):
    probe = FakeProbe(1.6)
    shapes = ((16, 300), (32, 72))
    choose_cpu_precision(product_workload(shapes, measure=probe),
                         cache_path=tmp_path / "precision.json", identity=HERE, today=DAY)
    assert probe.calls == [(shapes, MAX_ROWS)]  # tiny products: the most rows
    choose_cpu_precision(product_workload(measure=probe), cache_path=tmp_path / "other.json",
                         identity=HERE, today=DAY)
    assert probe.calls[1][0] == tuple(dict.fromkeys((min(i, MAX_WIDTH), min(o, MAX_WIDTH))
                                                    for i, o in DEFAULT_SHAPES))


def test_a_model_is_described_by_class_size_and_layers():
    """Two models of one size but other layers get other names: they are timed apart."""
    from seq2seq.models.interfaces import DecodingModel

    class Tiny(torch.nn.Sequential, DecodingModel):
        pass

    first = Tiny(torch.nn.Linear(4, 6), torch.nn.Linear(6, 4))  # 58 parameters
    other = Tiny(torch.nn.Linear(4, 6), torch.nn.Linear(6, 4, bias=False), torch.nn.Linear(1, 2))
    assert model_description(first).startswith("Tiny 0.0 M parameters [")
    assert first.parameter_count == other.parameter_count == 58
    assert model_description(first) != model_description(other)


def test_time_alternately_alternates_and_leaves_out_the_warm_up():
    calls = []
    times = time_alternately(lambda dtype, pair: calls.append((dtype, pair)), warmup=1,
                             repeats=3, budget_s=60)
    assert calls == [(dtype, pair) for pair in range(4) for dtype in (None, torch.bfloat16)]
    assert times.fp32_seconds >= 0 and times.bf16_seconds >= 0


def test_time_alternately_stops_at_its_budget_with_the_first_pair_as_the_measurement():
    calls = []
    time_alternately(lambda dtype, pair: calls.append(pair), warmup=1, repeats=5, budget_s=0)
    assert calls == [0, 0]  # one pair: over the budget at once, it is the measurement


def test_the_probes_products_stay_small():
    rows, capped = probe_products([(512, 32000), (512, 512)])
    assert capped == ((512, MAX_WIDTH), (512, 512))
    assert MIN_ROWS <= rows <= MAX_ROWS
    assert probe_products([(8, 8)])[0] == MAX_ROWS
    assert probe_products([(4096, 4096), (4096, 3000), (3000, 4096)]) == (
        MIN_ROWS, ((MAX_WIDTH, MAX_WIDTH),))  # all one shape once capped


def test_the_real_timer_returns_both_medians():
    """Only that it runs and answers (on tiny products): its numbers are not checked."""
    times = measure_products([(8, 8), (8, 16)], 4)
    assert times.fp32_seconds > 0 and times.bf16_seconds > 0
