"""benchmarks.bench (make bench): the matmul ceilings and ratios it reports, where bf16 is native
or not, and the profile commands it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from benchmarks import bench as bench_module
from benchmarks import profile_decoding, profile_training


@pytest.fixture
def bench():
    return bench_module


@pytest.mark.parametrize(("bf16_speed", "native"), [(0.2, False), (150.0, True)])
def test_bf16_ceiling_and_rows_only_where_bf16_is_native(bench, monkeypatch, bf16_speed, native):
    """An emulated bf16 (0.2 against 70 GFLOP/s on an AVX2 EPYC) is not timed at 4096^3, which
    would take minutes, and its rows are skipped; a native one is measured."""
    sizes = []

    def fake_ceiling(dtype, size=4096, repeats=3):
        sizes.append((dtype, size))
        return bf16_speed if dtype == torch.bfloat16 else 70.0

    monkeypatch.setattr(bench, "matmul_ceiling", fake_ceiling)
    ceilings, line = bench.matmul_ceilings()
    assert ceilings["fp32"] == 70.0
    assert ("bf16" in ceilings) == native
    assert ((torch.bfloat16, 4096) in sizes) == native
    assert ("bf16 rows skipped" in line) == (not native)


def test_ratios_use_only_the_rows_that_ran(bench):
    rows = [{"preset": "multi30k_gru_additive", "precision": "fp32",
             "tokens_per_second_median": 1000},
            {"preset": "multi30k_luong_fast", "precision": "fp32",
             "tokens_per_second_median": 1500}]
    assert bench.training_ratios(rows) == {"fast/like-for-like fp32": 1.5}
    rows.append({"preset": "multi30k_gru_additive", "precision": "bf16",
                 "tokens_per_second_median": 1800})
    assert bench.training_ratios(rows)["multi30k_gru_additive bf16/fp32"] == 1.8
    rows.append({"preset": "multi30k_transformer", "precision": "fp32",
                 "tokens_per_second_median": 900})
    assert bench.training_ratios(rows)["transformer/like-for-like fp32"] == 0.9


def test_auto_precisions_speed_is_a_share_of_the_faster_rows(bench):
    rows = [{"preset": "a", "precision": "fp32", "tokens_per_second_median": 1000},
            {"preset": "a", "precision": "bf16", "tokens_per_second_median": 600},
            {"preset": "b", "precision": "fp32", "tokens_per_second_median": 1000},
            {"preset": "b", "precision": "bf16", "tokens_per_second_median": 1600},
            {"preset": "c", "precision": "fp32", "tokens_per_second_median": 800}]  # emulated bf16
    assert bench.auto_precision_shares(rows, dict.fromkeys("abc", "fp32")) == {
        "a": 1.0, "b": 0.625, "c": 1.0}
    assert bench.auto_precision_shares(rows, dict.fromkeys("abc", "bf16")) == {
        "a": 0.6, "b": 1.0, "c": 0.0}
    # each preset goes by its own choice; one auto was not asked about has no share
    assert bench.auto_precision_shares(rows, {"a": "fp32", "b": "bf16"}) == {"a": 1.0, "b": 1.0}
    line = bench.auto_precision_line("b", "fp32", "bf16 0.60x fp32 on this CPU", 0.625)
    assert line == ("b: precision=auto -> fp32 (bf16 0.60x fp32 on this CPU); 62% of the "
                    "training speed of the faster of fp32 and bf16 above")


def test_an_emulated_bf16_leaves_out_every_bf16_run(bench):
    variants = ["fp32", "bf16", "fp16"]
    native = bench.runs_for({"fp32": 70.0, "bf16": 150.0}, variants)
    assert native["training"] == list(bench.TRAINING_RUNS)
    assert native["memory_precision"] == "bf16" and native["decoding"] == variants
    emulated = bench.runs_for({"fp32": 70.0}, variants)
    assert emulated["training"] == [run for run in bench.TRAINING_RUNS if run[1] == "fp32"]
    assert len(emulated["training"]) == 3
    assert emulated["memory_precision"] == "fp32"
    assert emulated["decoding"] == ["fp32", "fp16"]
    assert "emulated" in bench.skip_reason("bf16")


def test_profiles_cover_every_training_row_and_float_decoding_variant(bench, monkeypatch,
                                                                      tmp_path, capsys):
    """"Where the time goes": each training row against its precision's ceiling, greedy and
    beam 5 for each decoding variant with a ceiling (fp16 has none measured)."""
    calls = []

    def fake_profile(module, module_args, ceiling):
        calls.append((module, module_args, ceiling))
        return {"product_share": 0.75, "product_percent_of_ceiling": 90.0}

    monkeypatch.setattr(bench, "profile_products", fake_profile)
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"")
    args = argparse.Namespace(profile_steps=3, checkpoint=checkpoint)
    runs = {"training": [("multi30k_gru_additive", "fp32"), ("multi30k_gru_additive", "bf16")],
            "decoding": ["fp32", "bf16", "fp16"]}
    results = {}
    bench.print_profiles(runs, {"fp32": 70.0, "bf16": 150.0}, args, results)
    training = [c for c in calls if c[0] == "profile_training"]
    assert [(c[1][1], c[2]) for c in training] == [("trainer.precision=fp32", 70.0),
                                                   ("trainer.precision=bf16", 150.0)]
    assert "--steps" in training[0][1] and "3" in training[0][1]
    decoding = [(c[1][3], c[1][-1], c[2]) for c in calls if c[0] == "profile_decoding"]
    assert decoding == [("1", "fp32", 70.0), ("5", "fp32", 70.0), ("1", "bf16", 150.0),
                        ("5", "bf16", 150.0)]
    assert len(results["profiles"]) == 6
    out = capsys.readouterr().out
    assert "75%" in out and "90% of the ceiling" in out and "25%" in out


def test_profile_commands_parse_with_the_profilers_own_options(bench, monkeypatch, tmp_path):
    """What make bench passes each profiler is what that profiler accepts, and no checkpoint
    means no decoding profiles."""
    parsers = {"benchmarks.profile_training": profile_training.build_parser(),
               "benchmarks.profile_decoding": profile_decoding.build_parser()}
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        assert kwargs["cwd"] == bench.ROOT  # where `benchmarks` is importable
        output = Path(command[command.index("--json") + 1])
        output.write_text('{"product_share": 0.5, "product_percent_of_ceiling": null}')
        return argparse.Namespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"")
    runs = {"training": [("multi30k_luong_fast", "fp32")], "decoding": ["fp32"]}
    args = argparse.Namespace(profile_steps=2, checkpoint=checkpoint)
    bench.print_profiles(runs, {"fp32": 70.0}, args, {})
    assert len(commands) == 3
    for command in commands:
        assert command[1] == "-m"  # python -m benchmarks.<profiler>, from the checkout
        parsed = parsers[command[2]].parse_args(command[3:])
        assert parsed.ceiling == 70.0 and parsed.json is not None and parsed.rows == 1
    training = parsers["benchmarks.profile_training"].parse_args(commands[0][3:])
    assert training.steps == 2 and "trainer.precision=fp32" in training.overrides
    decoding = [parsers["benchmarks.profile_decoding"].parse_args(c[3:]) for c in commands[1:]]
    assert [(d.beam_size, d.precision, d.sentences) for d in decoding] == [
        (1, "fp32", bench.PROFILE_SENTENCES), (5, "fp32", bench.PROFILE_SENTENCES)]
    assert Path(decoding[0].checkpoint) == checkpoint

    commands.clear()
    args.checkpoint = tmp_path / "missing.pt"
    bench.print_profiles(runs, {"fp32": 70.0}, args, {})
    assert [c[2] for c in commands] == ["benchmarks.profile_training"]
