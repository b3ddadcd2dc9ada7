"""compare.py: a real 2 x 2 sweep (train.py -m) compared into a table, CSV, JSON and PNGs;
grouping, statistics, significance and errors on small inputs; the submitit launcher."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import (
    checkpoint_payload,
    random_transformer_model,
    transformer_model_config,
    write_copy_corpus,
)

from seq2seq.cli import compare as compare_cli
from seq2seq.inference.evaluation import attention_statistics
from seq2seq.study.labels import short_labels
from seq2seq.study.records import read_record
from seq2seq.study.report import (
    GroupRow,
    csv_text,
    json_text,
    markdown_report,
    mean_std,
    significance,
)
from seq2seq.study.runs import (
    Run,
    discover_runs,
    group_runs,
    left_out_of_labels,
    shared_settings,
)

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY_SWEEP = {"trainer.max_steps": 16, "trainer.valid_every": 8, "trainer.log_every": 4,
              "trainer.save_every": 8}


def run_sweep(run_python, overrides: list[str], sweep_dir: Path, *extra: str,
              timeout: int = 120) -> None:
    command = [ROOT / "train.py", "-m", *extra, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    result = run_python(command, cwd=sweep_dir.parent, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]


def compare_runs(argv: list[str]):
    """compare.py's run() on the config its command line ``argv`` composes, in this process."""
    from seq2seq.cli.app import bare_as_list
    from seq2seq.cli.common import compose

    return compare_cli.run(compose("compare", bare_as_list(argv, "runs")))


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 1000, path


def test_sweep_compared_into_table_files_and_plots(tiny_train_config, tmp_path, capsys,
                                                   monkeypatch, run_python, caplog):
    sweep = tmp_path / "sweep"
    run_sweep(run_python, tiny_train_config.overrides(**TINY_SWEEP), sweep,
              "model/attention=dot,general", "trainer.seed=1,2")
    # A run that never produced best.pt: a config but no checkpoint.
    (sweep / "9").mkdir()
    shutil.copy(sweep / "0" / "config.yaml", sweep / "9" / "config.yaml")

    record_dir = tmp_path / "records"
    monkeypatch.chdir(tmp_path)  # the records keep the data's paths relative to it
    with caplog.at_level("INFO", logger="seq2seq.compare"):
        comparison = compare_runs([str(sweep), "split=valid", "beam_size=2", "samples=200",
                                      "aso_iterations=50", f"records_dir={record_dir}"])
    table = capsys.readouterr().out
    # Scoring says where it is: run k of the n to score (the one without best.pt is not).
    assert [message.split(":")[0] for message in caplog.messages
            if message.startswith("run ")] == [f"run {k} of 4" for k in range(1, 5)]
    assert "| group |" in table and "p vs best (sentences)" in table
    assert "ASO eps_min vs best" in table

    rows = {row.label: row for row in comparison.rows}
    assert set(rows) == {"dot", "general"}  # what tells them apart
    assert {row.settings for row in comparison.rows} == {"model/attention=dot",
                                                         "model/attention=general"}
    assert [rows[label].runs for label in sorted(rows)] == [2, 2]
    assert rows["dot"].failed == 1
    assert [f["run"] for f in comparison.failed] == [str(sweep / "9")]
    assert "no checkpoints/best.pt" in comparison.failed[0]["reason"]
    assert f"failed: {sweep / '9'}" in table

    # Mean and standard deviation equal those of the per-run cached scores.
    per_run = {}
    for run in sorted(p for p in sweep.iterdir() if (p / "checkpoints" / "best.pt").exists()):
        cached = json.loads((run / "compare" / "best.valid.beam2.json").read_text())
        seed = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["seed"]
        assert cached["sentences"] == 40 and 0 < cached["attention_max_weight"] <= 1
        assert 0 <= cached["attention_backward_moves"] <= 1
        assert 0 < cached["attention_coverage"] <= 1
        per_run.setdefault(cached["run"], (seed, cached))
    records = list(csv.DictReader((sweep / "comparison.csv").open()))
    document = json.loads((sweep / "comparison.json").read_text())
    assert len(records) == 2 and len(document["groups"]) == 2
    assert document["failed_runs"][0]["run"] == str(sweep / "9")
    for group in document["groups"]:
        bleus = [per_run[r["run"]][1]["bleu"] for r in group["per_run"]]
        chrfs = [per_run[r["run"]][1]["chrf"] for r in group["per_run"]]
        assert sorted(r["seed"] for r in group["per_run"]) == [1, 2]
        assert group["bleu_mean"] == pytest.approx(statistics.fmean(bleus))
        assert group["bleu_std"] == pytest.approx(statistics.stdev(bleus))
        assert group["chrf_mean"] == pytest.approx(statistics.fmean(chrfs))
        assert group["chrf_std"] == pytest.approx(statistics.stdev(chrfs))
        record = next(r for r in records if r["group"] == group["group"])
        assert float(record["bleu_mean"]) == pytest.approx(group["bleu_mean"])
        assert group["steps"] == 16 and group["train_tokens_per_second"] > 0
        if group["best"]:
            assert group["p_value"] is None and record["p_value"] == ""
            assert group["aso_eps_min_vs_best"] is None
        else:
            assert 0.0 <= group["p_value"] <= 1.0 and 0.0 <= float(record["p_value"]) <= 1.0
            if importlib.util.find_spec("deepsig"):  # ASO over the two seeds of each group
                assert 0.0 <= group["aso_eps_min_vs_best"] <= 1.0
                # 2 runs against 2 can never reach the corrected level: a win is provisional
                assert group["aso_provisional"] == (group["aso_eps_min_vs_best"] < 0.2)
    assert "paired bootstrap" in document["significance_test"]
    markdown = (sweep / "comparison.md").read_text()
    assert "## Failed runs" in markdown and "p vs best" in markdown
    assert "## Significance over seeds (Almost Stochastic Order)" in markdown
    for name in ("valid_bleu_curves.png", "valid_bleu_by_step.png", "valid_bleu.png",
                 "attention_heatmaps.png",
                 "valid_bleu_by_length.png", "valid_accuracy_by_position.png",
                 "valid_faithfulness.png"):
        assert_png(sweep / name)
    # Where each group wins: by source length, every scored sentence in one bucket.
    assert "## By source length" in markdown
    for group in document["length_buckets"]:
        assert sum(b["sentences"] for b in group["buckets"].values()) == 40
    # By target position: each third's accuracy is its runs' pooled counts'.
    assert "## By target position" in markdown
    for group in document["positions"]:
        runs = next(g for g in document["groups"] if g["group"] == group["group"])["per_run"]
        counts = np.sum([per_run[r["run"]][1]["position_counts"] for r in runs], axis=0)
        assert counts.shape == (40, 3, 2) and (counts[..., 0] <= counts[..., 1]).all()
        for k, third in enumerate(("first", "middle", "last")):
            assert group["thirds"][third]["accuracy"] == pytest.approx(
                100 * counts[:, k, 0].sum() / counts[:, k, 1].sum())
            assert group["thirds"][third]["ci"] >= 0
    # What the weights say: each probe's drop is the runs' BLEU minus their probed BLEU.
    assert "## What the weights say" in markdown
    for group in document["faithfulness"]:
        runs = next(g for g in document["groups"] if g["group"] == group["group"])["per_run"]
        scored = [per_run[r["run"]][1] for r in runs]
        for probe in ("uniform", "shifted"):
            assert group[probe]["drop"] == pytest.approx(statistics.fmean(
                s["bleu"] - s["faithfulness"][probe]["bleu"] for s in scored))

    # The second call reads every run's cached scores: no translation at all.
    from seq2seq.inference import evaluation

    def no_translation(*args, **kwargs):
        raise AssertionError("cached scores were not used")

    monkeypatch.setattr(evaluation, "evaluate_translations", no_translation)
    again = compare_runs([str(sweep / "*"), "split=valid", "beam_size=2", "plots=false",
                             "aso_iterations=0", f"output_dir={tmp_path / 'report'}"])
    assert {row.label: row.bleu for row in again.rows} == {k: r.bleu for k, r in rows.items()}
    assert (tmp_path / "report" / "comparison.json").is_file()

    # The records alone rebuild the report (no run folder, no checkpoint, no translation).
    assert sorted(p.name for p in record_dir.iterdir()) == [
        f"sweep-{n}.run.json.gz" for n in range(4)]
    assert max(p.stat().st_size for p in record_dir.iterdir()) < 30_000
    compare_runs([str(record_dir), "split=valid", "beam_size=2", "samples=200",
                     "aso_iterations=50", f"output_dir={tmp_path / 'rebuilt'}"])
    rebuilt_document = json.loads((tmp_path / "rebuilt" / "comparison.json").read_text())
    for key in ("length_buckets", "positions", "faithfulness", "seed_significance"):
        assert rebuilt_document[key] == document[key], key
    for group, rebuilt_group in zip(document["groups"], rebuilt_document["groups"], strict=True):
        for key in ("group", "bleu_mean", "bleu_std", "p_value", "steps", "attention_coverage"):
            assert rebuilt_group[key] == group[key], key
    assert_png(tmp_path / "rebuilt" / "valid_bleu_curves.png")
    first_record = read_record(record_dir / "sweep-0.run.json.gz")
    assert [step for step, _ in first_record.log.bleu_steps] == [8, 16]
    assert first_record.scores["src"] == str(Path("corpus") / "valid.src")
    # Records beside their own run folders: each run counted once.
    both = compare_runs([str(sweep), str(record_dir), "split=valid", "beam_size=2",
                            "plots=false", "aso_iterations=0", f"output_dir={tmp_path / 'both'}"])
    assert sorted(row.runs for row in both.rows) == [2, 2]
    # A record scored with other settings is not mixed in.
    with pytest.raises(SystemExit):
        compare_runs([str(record_dir), "split=valid", "beam_size=3", "plots=false",
                         "aso_iterations=0", f"output_dir={tmp_path / 'other'}"])
    assert capsys.readouterr().out.count("recorded with other scoring settings") == 4


def make_run(folder: Path, *, attention: str, seed: int, checkpoint: bool = True) -> Path:
    folder.mkdir(parents=True)
    config = {"model": {"attention": {"_target_": f"seq2seq.models.attention.{attention}"}},
              "trainer": {"seed": seed, "max_steps": 10}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    if checkpoint:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "best.pt").write_bytes(b"")
        (folder / "checkpoints" / "last.pt").write_bytes(b"")  # unreadable: taken as finished
    return folder


def test_runs_are_grouped_by_differing_keys_without_the_seed(tmp_path):
    for number, (attention, seed) in enumerate(
        [("DotScorer", 1), ("DotScorer", 2), ("GeneralScorer", 1), ("GeneralScorer", 2)]
    ):
        make_run(tmp_path / "sweep" / str(number), attention=attention, seed=seed,
                 checkpoint=number != 3)
    runs = discover_runs([str(tmp_path / "sweep")])
    keys, groups = group_runs(runs)
    assert keys == ["model.attention._target_"]
    # Class paths as runs before checkpoint format 2 recorded them read as registry names.
    assert [g.settings for g in groups] == ["model.attention._target_=dot",
                                           "model.attention._target_=general"]
    assert [g.label for g in groups] == ["dot", "general"]
    assert [len(g.ok_runs) for g in groups] == [2, 1]
    assert [r.path.name for r in groups[1].failed_runs] == ["3"]


def test_old_and_new_runs_of_one_setting_are_one_group(tmp_path):
    """A run (or study record) from before registry names and one from after compare as one
    group: the sixth seed of a study joins the five before it."""
    old = make_run(tmp_path / "sweep" / "old", attention="AdditiveScorer", seed=1)
    new = tmp_path / "sweep" / "new"
    new.mkdir()
    (new / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"attention": {"_target_": "additive"}}, "trainer": {"seed": 2,
                                                                       "max_steps": 10}}))
    (new / "checkpoints").mkdir()
    for name in ("best.pt", "last.pt"):
        (new / "checkpoints" / name).write_bytes(b"")
    keys, groups = group_runs(discover_runs([str(tmp_path / "sweep")]))
    assert keys == [] and len(groups) == 1 and len(groups[0].runs) == 2
    assert old.exists()


def test_a_run_where_auto_chose_bf16_groups_with_one_pinned_to_bf16(tmp_path):
    """precision=auto is read as the precision the run's config records it trained in, or, for
    a run from before that record, as what its train.log says auto chose: a sixth seed pinned
    to bf16 joins five that said auto and trained in bf16; a log that does not say keeps
    auto."""
    recorded = {"recorded-bf16": "bf16", "recorded-fp32": "fp32"}  # no train.log
    lines = {"auto-bf16": "[x][seq2seq.training.trainer][INFO] - trainer.precision=auto -> bf16 "
                          "(bf16 1.62x fp32 on this CPU, measured now in 0.31 s, cached in ...)\n",
             "auto-fp32": "... - trainer.precision=auto -> fp32 (bf16 0.60x fp32 on this CPU, ...)\n",
             "auto-unsaid": "no such line\n"}
    precisions = {"auto-bf16": "auto", "pinned": "bf16", "auto-fp32": "auto",
                  "auto-unsaid": "auto", "recorded-bf16": "auto", "recorded-fp32": "auto"}
    for seed, (name, precision) in enumerate(precisions.items(), start=1):
        folder = make_run(tmp_path / "sweep" / name, attention="DotScorer", seed=seed)
        config = yaml.safe_load((folder / "config.yaml").read_text())
        config["trainer"]["precision"] = precision
        if name in recorded:
            config["trained_precision"] = recorded[name]
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        if name in lines:
            (folder / "train.log").write_text(lines[name])
    keys, groups = group_runs(discover_runs([str(tmp_path / "sweep")]))
    assert keys == ["trainer.precision"]  # the record is read into trainer.precision
    assert {g.values["trainer.precision"]: sorted(r.path.name for r in g.runs) for g in groups} == {
        "bf16": ["auto-bf16", "pinned", "recorded-bf16"], "fp32": ["auto-fp32", "recorded-fp32"],
        "auto": ["auto-unsaid"]}


def test_a_key_set_on_top_of_a_group_choice_is_shown_in_the_label(tmp_path):
    from seq2seq.study.runs import Run

    def run(number: int, attention: str, normalizer: str, seed: int) -> Run:
        config = {"model/attention": attention, "trainer.seed": seed,
                  "model.attention._target_": f"seq2seq.models.attention.{attention.title()}",
                  "model.attention.normalizer": normalizer}
        return Run(path=tmp_path / str(number), config=config, checkpoint=None)

    runs = [run(0, "dot", "softmax", 1), run(1, "dot", "softmax", 2),
            run(2, "general", "softmax", 1), run(3, "dot", "sparsemax", 1)]
    _, groups = group_runs(runs)
    assert [g.settings for g in groups] == [
        "model/attention=dot, model.attention.normalizer=softmax",
        "model/attention=general, model.attention.normalizer=softmax",
        "model/attention=dot, model.attention.normalizer=sparsemax",
    ]
    assert [g.label for g in groups] == ["dot", "general", "dot + sparsemax"]
    assert [len(g.runs) for g in groups] == [2, 1, 1]
    # Without the extra key, the choice alone names the groups (its _target_ is implied).
    _, groups = group_runs(runs[:3])
    assert [g.settings for g in groups] == ["model/attention=dot", "model/attention=general"]


def test_what_an_experiment_preset_fixes_is_left_out_of_the_label(tmp_path):
    from seq2seq.study.runs import Run

    def run(number: int, experiment: str, attention: str, decoder: str) -> Run:
        config = {"experiment/": experiment, "model/attention": attention,
                  "model/decoder": decoder, "trainer.seed": number,
                  "model.decoder._target_": decoder.title(),
                  "model.attention._target_": attention.title(), "model.embed_dim": experiment}
        return Run(path=tmp_path / str(number), config=config, checkpoint=None)

    runs = [run(0, "rnn", "dot", "luong"), run(1, "rnn", "additive", "luong"),
            run(2, "transformer", "additive", "transformer")]
    keys, groups = group_runs(runs)
    assert "model/decoder" in keys  # still a grouping key: only the label leaves it out
    assert [g.settings for g in groups] == ["experiment=rnn, model/attention=dot",
                                           "experiment=rnn, model/attention=additive",
                                           "experiment=transformer, model/attention=additive"]
    assert [g.label for g in groups] == ["dot", "additive", "transformer + additive"]
    # Crossed choices fix neither: both are shown.
    crossed = [run(0, "rnn", "dot", "luong"), run(1, "rnn", "dot", "bahdanau"),
               run(2, "transformer", "dot", "luong")]
    assert [g.settings for g in group_runs(crossed)[1]] == [
        "experiment=rnn, model/decoder=luong", "experiment=rnn, model/decoder=bahdanau",
        "experiment=transformer, model/decoder=luong"]
    assert [g.label for g in group_runs(crossed)[1]] == [
        "luong", "bahdanau", "transformer + luong"]


def test_labels_of_null_and_top_level_choices_and_of_runs_without_choices(tmp_path):
    from seq2seq.study.runs import Run

    def run(number: int, **config) -> Run:
        return Run(path=tmp_path / str(number), config={"trainer.seed": 1, **config},
                   checkpoint=None)

    # Without a preset every differing choice is shown; a null choice (the Transformer's
    # model/attention) reads as Hydra spells it, with nothing under its node.
    rnn = {"model/decoder": "luong", "model.decoder._target_": "Luong",
           "model/attention": "dot", "model.attention._target_": "Dot"}
    runs = [run(0, **rnn, **{"model.attention.normalizer": "softmax"}),
            run(1, **rnn, **{"model.attention.normalizer": "sparsemax"}),
            run(2, **{"model/decoder": "transformer", "model.decoder._target_": "Transformer",
                      "model/attention": None})]
    assert [g.settings for g in group_runs(runs)[1]] == [
        "model/attention=dot, model/decoder=luong, model.attention.normalizer=softmax",
        "model/attention=dot, model/decoder=luong, model.attention.normalizer=sparsemax",
        "model/attention=null, model/decoder=transformer"]
    # dot and luong are what most groups share; null is no scorer: each says the rest.
    assert [g.label for g in group_runs(runs)[1]] == ["softmax", "sparsemax", "transformer"]
    # A top-level choice (recorded as "optimizer/") implies the keys under its node.
    runs = [run(0, **{"optimizer/": "adam", "optimizer._target_": "Adam"}),
            run(1, **{"optimizer/": "adamw", "optimizer._target_": "AdamW"})]
    assert [g.settings for g in group_runs(runs)[1]] == ["optimizer=adam", "optimizer=adamw"]
    assert [g.label for g in group_runs(runs)[1]] == ["adam", "adamw"]
    # Runs that recorded no choices keep the keys that tell them apart.
    runs = [run(0, **{"experiment/": "rnn", "optimizer.lr": 1}),
            run(1, **{"experiment/": "transformer", "optimizer.lr": 2}),
            run(2, **{"optimizer.lr": 4}), run(3, **{"optimizer.lr": 3})]
    assert [g.settings for g in group_runs(runs)[1]] == [
        "experiment=rnn, optimizer.lr=1", "experiment=transformer, optimizer.lr=2",
        "experiment=-, optimizer.lr=4", "experiment=-, optimizer.lr=3"]
    # A number keeps its key; no experiment is no name to show.
    assert [g.label for g in group_runs(runs)[1]] == [
        "rnn + lr=1", "transformer + lr=2", "lr=4", "lr=3"]


def study_run(path: Path, seed: int, **config) -> Run:
    """A run of the attention study's kind: the RNN preset and a scorer unless told otherwise."""
    choices = {"experiment/": "multi30k_luong_fast", "data/": "multi30k",
               "model/attention": "additive", "trainer.max_steps": 4000}
    config = {**choices, **config, "trainer.seed": seed}
    if config["model/attention"] is not None:
        config.setdefault("model.attention._target_", config["model/attention"])
        config.setdefault("model.attention.normalizer", "softmax")
    return Run(path=path / f"{len(list(path.glob('*')))}-{seed}", config=config, checkpoint=None)


def test_short_labels_show_what_differs_and_the_settings_keep_the_rest(tmp_path):
    """A label keeps only what tells its group from the others; what most groups share is said
    once (left_out_of_labels), and the settings in full stay with each group."""
    runs = []
    for attention, normalizer in [("additive", "softmax"), ("scaled_dot", "softmax"),
                                  ("scaled_dot", "sparsemax"), ("dot", "softmax")]:
        for seed in (1, 2):
            run = study_run(tmp_path, seed, **{"model/attention": attention,
                                               "model.attention.normalizer": normalizer})
            runs.append(run)
            tmp_path.joinpath(run.path.name).mkdir()
    transformer = {"experiment/": "multi30k_transformer", "model/attention": None,
                   "model.decoder._target_": "transformer"}
    runs += [study_run(tmp_path, seed, **transformer) for seed in (1, 2)]
    _, groups = group_runs(runs)
    # Two keys differ among the RNN groups, the preset between them and the Transformer.
    assert [g.label for g in groups] == ["additive", "scaled_dot", "scaled_dot + sparsemax",
                                        "dot", "transformer"]
    assert [len(g.runs) for g in groups] == [2] * 5
    assert groups[2].settings == ("experiment=multi30k_luong_fast, model/attention=scaled_dot, "
                                  "model.attention.normalizer=sparsemax")
    assert groups[4].settings == "experiment=multi30k_transformer, model/attention=null"
    assert left_out_of_labels(groups) == {"experiment/": "multi30k_luong_fast",
                                          "model.attention.normalizer": "softmax"}
    shared = shared_settings(runs)
    assert shared == {"data/": "multi30k", "trainer.max_steps": 4000}

    # One key: its values alone.
    _, groups = group_runs(runs[:2] + runs[6:8])
    assert [g.label for g in groups] == ["additive", "dot"]
    assert left_out_of_labels(groups) == {}
    # A key one group has and the others lack: shown where it is, nowhere else.
    extra = [study_run(tmp_path, 1, **{"model/attention": name}) for name in ("dot", "general")]
    extra.append(study_run(tmp_path, 1, **{"model/attention": "general",
                                           "model.attention.scorer_bias": "zero"}))
    assert [g.label for g in group_runs(extra)[1]] == ["dot", "general", "general + zero"]
    # Runs that differ only by seed: one group, nothing to tell apart.
    _, groups = group_runs(runs[:2])
    assert [(g.label, g.settings) for g in groups] == [("all", "all")]


def test_short_labels_of_equal_or_ambiguous_settings():
    # Identical settings (which no grouping makes, but the helper takes): the full text, alike.
    same = {"model/attention": "dot", "model.attention.normalizer": "softmax"}
    full = "model/attention=dot, model.attention.normalizer=softmax"
    assert short_labels([same, dict(same)]) == ([full, full], {})
    # A name two keys share keeps its key; a number or a flag always does.
    labels, left_out = short_labels([
        {"model/encoder": "transformer", "model/decoder": "luong", "optimizer.lr": 1},
        {"model/encoder": "rnn", "model/decoder": "transformer", "optimizer.lr": 2},
        {"model/encoder": "rnn", "model/decoder": "luong", "trainer.compile": True}])
    assert labels == ["encoder=transformer + lr=1", "decoder=transformer + lr=2",
                      "compile=true"]
    assert left_out == {"model/encoder": "rnn", "model/decoder": "luong"}
    # A prefix every name of one key shares, to an underscore, is left out.
    assert short_labels([{"experiment/": "multi30k_luong_fast"},
                         {"experiment/": "multi30k_transformer"}])[0] == [
        "luong_fast", "transformer"]


def test_general_with_scale_false_joins_the_runs_from_before_the_option(tmp_path):
    """model.attention.scale=false is what general computed before the option existed: such a
    run (a sixth seed) joins the ones recorded without the key; scale=true is its own group."""
    def recorded(attention: str, seed: int) -> Run:
        return Run(path=tmp_path / f"{attention}-{seed}", checkpoint=None, config={
            "model/attention": attention, "model.attention._target_": attention,
            "model.attention.normalizer": "softmax", "trainer.seed": seed})

    def trained(name: str, seed: int, scale: bool) -> Path:
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        config = {"model": {"attention": {"_target_": "general", "scale": scale,
                                          "normalizer": "softmax"}}, "trainer": {"seed": seed}}
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
            {"hydra": {"runtime": {"choices": {"model/attention": "general"}}}}))
        return folder

    runs = [recorded("general", 1), recorded("general", 2), recorded("additive", 1),
            *discover_runs([str(trained("sixth", 6, False)), str(trained("scaled", 1, True))])]
    sixth = next(run for run in runs if run.path.name == "sixth")
    assert "model.attention.scale" not in sixth.config  # false: as before the option
    _, groups = group_runs(runs)
    assert [(g.label, len(g.runs)) for g in groups] == [
        ("general", 3), ("additive", 1), ("general + scale=true", 1)]
    assert sixth in groups[0].runs
    assert groups[2].settings == "model/attention=general, model.attention.scale=true"


def test_the_report_says_what_the_labels_leave_out_and_lists_the_settings():
    rows = [GroupRow(label=label, runs=5, failed=0, seeds=[1, 2, 3, 4, 5], parameters=10,
                     tokens_per_second=1.0, steps=4000, bleu=(37.9, 0.5), chrf=(57.1, 0.4),
                     sentences_per_second=60.0, attention_entropy=1.0,
                     attention_max_weight=0.5, attention_backward_moves=0.1,
                     attention_coverage=0.8, settings=settings)
            for label, settings in [
                ("additive", "experiment=multi30k_luong_fast, model/attention=additive, "
                             "model.attention.normalizer=softmax"),
                ("transformer", "experiment=multi30k_transformer, model/attention=null")]]
    meta = {"split": "test", "beam_size": 5, "runs": 10, "differing_keys": ["experiment/"],
            "shared_settings": {"data/": "multi30k", "trainer/": "default",
                                "trainer.max_steps": 4000},
            "left_out_of_labels": {"experiment/": "multi30k_luong_fast",
                                   "model.attention.normalizer": "softmax"}}
    text = markdown_report(rows, [], meta)
    before_table = text.split("| group |")[0]
    assert "Every group: data=multi30k, trainer=default." in before_table
    assert "1 more settings every run shares (config keys) are in comparison.json's " \
        "`shared_settings`." in before_table
    assert ("Unless its label says otherwise (or it lacks the setting): "
            "experiment=multi30k_luong_fast, model.attention.normalizer=softmax.") in before_table
    assert "| additive | 5 |" in text
    legend = text.split("## The groups")[1]
    assert ("| transformer | experiment=multi30k_transformer, model/attention=null |"
            in legend)
    document = json.loads(json_text(rows, [], meta))
    assert [g["settings"] for g in document["groups"]] == [row.settings for row in rows]
    assert document["left_out_of_labels"]["model.attention.normalizer"] == "softmax"
    assert list(csv.DictReader(io.StringIO(csv_text(rows))))[1]["settings"] == rows[1].settings


def test_a_run_cut_off_before_the_end_of_its_budget_is_not_complete(tiny_train_config, tmp_path):
    from seq2seq.checkpoint import load_checkpoint, save_checkpoint
    from seq2seq.training.run import train

    for name in ("finished", "cut_off"):
        train(tiny_train_config(**{"trainer.max_steps": 8, "trainer.valid_every": 4,
                                   "trainer.save_every": 4}), tmp_path / "sweep" / name)
    last = tmp_path / "sweep" / "cut_off" / "checkpoints" / "last.pt"
    checkpoint = load_checkpoint(last)
    checkpoint["trainer_state"]["step"] = 4  # as a last.pt saved half way through
    save_checkpoint(checkpoint, last)
    (tmp_path / "sweep" / "cut_early").mkdir()
    shutil.copytree(tmp_path / "sweep" / "finished", tmp_path / "sweep" / "cut_early",
                    dirs_exist_ok=True)
    (tmp_path / "sweep" / "cut_early" / "checkpoints" / "last.pt").unlink()
    runs = {run.path.name: run for run in discover_runs([str(tmp_path / "sweep")])}
    assert runs["finished"].ok
    assert "unfinished: its last.pt is at step 4 with budget left" in runs["cut_off"].failure
    assert "unfinished: no checkpoints/last.pt yet" in runs["cut_early"].failure


def test_a_damaged_run_record_is_a_failed_run(tmp_path):
    make_run(tmp_path / "sweep" / "0", attention="DotScorer", seed=1)
    (tmp_path / "sweep" / "old-0.run.json.gz").write_bytes(b"not gzip")
    runs = discover_runs([str(tmp_path / "sweep")])
    assert [run.ok for run in runs] == [True, False]
    assert "cannot read the record" in runs[1].failure


def test_no_scorable_run_is_an_error_after_the_listing(tmp_path, capsys):
    make_run(tmp_path / "runs" / "a", attention="DotScorer", seed=1, checkpoint=False)
    make_run(tmp_path / "runs" / "b", attention="DotScorer", seed=1)  # an empty best.pt
    with pytest.raises(SystemExit) as exit_info:
        compare_runs([str(tmp_path / "runs"), "plots=false"])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert f"failed: {tmp_path / 'runs' / 'a'}" in captured.out
    assert f"failed: {tmp_path / 'runs' / 'b'}" in captured.out and "scoring failed" in captured.out
    assert captured.err.strip().splitlines()[-1].startswith("error: none of the 2 runs")
    assert json.loads((tmp_path / "runs" / "comparison.json").read_text())["failed_runs"]


def test_statistics_and_significance():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert math.isnan(mean_std([5.0])[1])
    statistics = attention_statistics([np.array([[1.0, 0.0], [0.5, 0.5]]), None])
    assert statistics.entropy == pytest.approx(math.log(2) / 2)
    assert statistics.max_weight == pytest.approx(0.75)
    references = [f"the {w} sat on the mat" for w in ("cat", "dog", "bird", "cow", "fox")] * 4
    good = [list(references), list(references)]
    bad = [["a b c"] * len(references), ["a b c"] * len(references)]
    p_values = significance([("good", good), ("bad", bad)], references, samples=100)
    assert p_values["good"] is None and p_values["bad"] < 0.05


def test_backward_moves_and_coverage_of_attention():
    """Rows: target steps, the last one EOS; columns: source pieces, the last one EOS."""
    eye = np.eye(4)  # three pieces in order, then EOS on EOS
    flipped = np.vstack([eye[:3][::-1], eye[3]])  # the three pieces in reverse order
    assert attention_statistics([eye]).backward_moves == 0.0
    assert attention_statistics([flipped]).backward_moves == 1.0
    assert attention_statistics([eye, flipped]).backward_moves == 0.5  # 2 of 4 moves
    assert attention_statistics([eye]).coverage == 1.0
    # Every step on the first piece: the other two never get half a step's attention.
    stuck = np.zeros((4, 4))
    stuck[:3, 0] = stuck[3, 3] = 1.0
    assert attention_statistics([stuck]).coverage == pytest.approx(1 / 3)
    assert attention_statistics([stuck]).backward_moves == 0.0
    # Uniform over three pieces and EOS for three steps: each piece gets 3/4 in all: covered.
    uniform = np.full((3, 4), 0.25)
    assert attention_statistics([uniform]).coverage == 1.0
    assert math.isnan(attention_statistics([None]).coverage)
    assert math.isnan(attention_statistics([np.ones((1, 1))]).backward_moves)  # no pair of steps


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{empty}"], "no run folder"),
        (["{empty}/nothing_here"], "no such folder"),
        (["{empty}", "split=train"], "split must be valid or test"),
        (["{empty}", "beam_size=x"], "beam_size: expected an integer"),
        (["{empty}", "beam_size=0"], "beam_size must be at least 1, got 0"),  # DecodeOptions'
        (["{empty}", "length_penalty=-1"], "length_penalty must be a number >= 0, got -1"),
        (["{empty}", "search=sample"], "search=sample: compare.py scores every run's best.pt "
                                       "alike, with beam search"),
        (["{empty}", "colour=red"], "colour is not an option of compare.yaml; --help lists them"),
        (["{empty}", "+beem_size=3"], "beem_size is not an option of compare.yaml (did you "
                                      "mean beam_size?)"),
        ([], "no run folder given"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, capsys, monkeypatch, argv, message):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    monkeypatch.setattr("sys.argv", ["compare.py", *(a.format(empty=tmp_path / "empty")
                                                    for a in argv)])
    with pytest.raises(SystemExit) as exit_info:
        compare_cli.main()
    assert exit_info.value.code == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if line.startswith("error: ")]
    assert len(err) == 1 and message in err[0], err


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                    reason="hydra-submitit-launcher is not installed (pip install .[cluster])")
def test_submitit_local_sweep_is_compared(tiny_train_config, tmp_path, capsys, run_python):
    """One job: the submitit folder layout is what is tested here (grouping is the sweep test's)."""
    sweep = tmp_path / "cluster_sweep"
    run_sweep(run_python, tiny_train_config.overrides(**TINY_SWEEP), sweep,
              "hydra/launcher=submitit_local",
              "hydra.launcher.timeout_min=5", "model/attention=dot", "trainer.seed=1",
              timeout=240)
    comparison = compare_runs([str(sweep), "split=valid", "beam_size=1", "plots=false"])
    assert len(comparison.rows) == 1 and comparison.rows[0].runs == 1 and not comparison.failed
    # Scored from the job's own run folder, which holds the run's config and checkpoints.
    assert (sweep / "0" / "compare" / "best.valid.beam1.json").is_file()


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="hydra-joblib-launcher is not installed (pip install .[study])")
def test_side_by_side_sweep_resumes_without_redoing_finished_runs(tiny_train_config, tmp_path,
                                                                  run_python):
    """The study's sweep: two jobs at a time, a folder per run named by its settings, and
    trainer.resume=auto, so running the command again only trains what is missing."""
    sweep = tmp_path / "study"
    study = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trainer.resume=auto",
             "hydra.sweep.subdir=${hydra:runtime.choices.model/attention}-seed${trainer.seed}",
             "model/attention=dot,general", "trainer.seed=1"]
    overrides = tiny_train_config.overrides(**TINY_SWEEP)
    run_sweep(run_python, overrides, sweep, *study, timeout=240)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name[0] != ".") == [
        "dot-seed1", "general-seed1"]
    finished = sweep / "dot-seed1" / "checkpoints" / "best.pt"
    stamp = finished.stat().st_mtime_ns
    shutil.rmtree(sweep / "general-seed1")  # as if the sweep had stopped before this run

    run_sweep(run_python, overrides, sweep, *study, timeout=240)
    assert finished.stat().st_mtime_ns == stamp  # not trained again
    assert "resumed from" in (sweep / "dot-seed1" / "train.log").read_text()
    assert (sweep / "general-seed1" / "checkpoints" / "best.pt").is_file()
    comparison = compare_runs([str(sweep), "split=valid", "beam_size=1", "plots=false",
                                  "probes=false", "aso_iterations=0"])
    assert [row.runs for row in comparison.rows] == [1, 1] and not comparison.failed


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is not installed (pip install .[cluster])")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm_gpu"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 1


def test_parameter_count_counts_tied_embeddings_once(tmp_path):
    """A checkpoint keeps tied weights as two keys over one storage; the count the report's
    params column takes (the translator's) counts them once, as ``model.parameters()`` does."""
    from seq2seq.checkpoint import load_checkpoint, save_checkpoint
    from seq2seq.inference.runtimes import load_translator

    model = random_transformer_model(vocab=39, tie_embeddings=True)
    payload = checkpoint_payload(model, write_copy_corpus(tmp_path),
                                 transformer_model_config(tie_embeddings=True))
    save_checkpoint(payload, tmp_path / "tied.pt")
    loaded = load_checkpoint(tmp_path / "tied.pt")
    state_numbers = sum(t.numel() for t in loaded["model"].values())
    translator = load_translator(tmp_path / "tied.pt", "cpu")
    parameters = sum(p.numel() for p in model.parameters())
    assert translator.parameter_count == parameters < state_numbers  # the tie is in the state


def test_help_lists_every_option_once_with_what_it_does_and_its_default(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["compare.py", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        compare_cli.main()
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    listed = [name for name, _ in re.findall(r"^  (\S+) +(.+)$", text.split("Options")[1],
                                             re.MULTILINE)]
    assert len(listed) == len(set(listed)) and listed[:2] == ["runs", "split"]
    assert re.search(r"^  beam_size +beams per sentence; 1: greedy search \[default 5\]$", text,
                     re.MULTILINE)  # DecodeOptions' words


def test_the_settings_key_of_the_records_already_written_is_kept():
    """ScoringOptions holds a DecodeOptions, and its key is still the flat one the cache and
    the run records (docs/attention_study/runs) were written with: they stay valid."""
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.study.scoring import ScoringOptions, settings_key

    assert settings_key(ScoringOptions(device="cpu")) == {"version": 3, "settings": {
        "beam_size": 5, "heatmap_sentence": 0, "length_penalty": 1.0, "max_len_a": 1.5,
        "max_len_b": 10, "max_source_length": 250, "max_tokens": 4000, "precision": "fp32",
        "probes": True, "split": "test"}}
    key = settings_key(ScoringOptions(decoding=DecodeOptions(beam_size=2), device="cpu"))
    assert key["settings"]["beam_size"] == 2
    # Another option a library caller changes is in the key too: no stale cache is reused.
    sampled = settings_key(ScoringOptions(decoding=DecodeOptions(search="sample", nbest=2),
                                          device="cpu"))["settings"]
    assert (sampled["search"], sampled["nbest"]) == ("sample", 2) and "seed" not in sampled
