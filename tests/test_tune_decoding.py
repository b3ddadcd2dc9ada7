"""seq2seq-tune-decoding: the decoding grid scored on the valid split, run as the user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

TOOL = ["-m", "seq2seq.cli.tune_decoding"]  # what the seq2seq-tune-decoding console script runs
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
SENTENCES = 12


@pytest.fixture
def run_script(run_python):
    """run(args, *, cwd): ``python -m seq2seq.cli.tune_decoding args`` (conftest)."""

    def run(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess:
        return run_python([*TOOL, *args], cwd=cwd, env=ENV, timeout=180)

    return run


@pytest.fixture
def workdir(tmp_path, trained_checkpoint) -> Path:
    """The copy model and the corpus it names (relatively) in a fresh folder."""
    shutil.copytree(trained_checkpoint.parents[1] / "corpus", tmp_path / "corpus")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copy(trained_checkpoint, tmp_path / "run" / "checkpoints" / "best.pt")
    return tmp_path


def test_grid_on_valid_picks_the_best_cell_as_evaluate_scores_it(run_script, workdir, monkeypatch):
    result = run_script(
        ["checkpoint=run/checkpoints/best.pt", "beam_sizes=[1,3]", "length_penalties=[0.6,1.4]",
         f"max_sentences={SENTENCES}", "device=cpu", "num_threads=1", "json=out/tune.json"],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "lp=0.6" in out and "lp=1.4" in out
    rows = {line.split("|")[0].strip(): line for line in out.splitlines() if "|" in line}
    assert {"1", "3"} <= set(rows)
    assert "greedy" in out

    report = json.loads((workdir / "out" / "tune.json").read_text(encoding="utf-8"))
    assert report["split"] == "valid" and report["sentences"] == SENTENCES
    cells = {(c["beam_size"], c["length_penalty"]): c for c in report["cells"]}
    assert set(cells) == {(1, 0.6), (1, 1.4), (3, 0.6), (3, 1.4)}
    for (beam_size, _), cell in cells.items():
        assert f"{cell['bleu']:6.2f} r{cell['length_ratio']:.3f}" in rows[str(beam_size)]
        assert 0 < cell["length_ratio"] < 3
    assert cells[1, 0.6]["bleu"] == cells[1, 1.4]["bleu"]  # greedy: translated once
    assert [c["evaluated"] for c in report["cells"][:2]] == [True, False]

    best = report["best"]
    assert best["bleu"] == max(c["bleu"] for c in report["cells"])
    command = (f"seq2seq-evaluate checkpoint=run/checkpoints/best.pt split=test "
               f"beam_size={best['beam_size']} length_penalty={best['length_penalty']:g}")
    assert command in out and report["test_command"] == command
    assert f"BLEU {best['bleu']:.2f}, length ratio {best['length_ratio']:.3f}" in out

    # The chosen setting's BLEU is what evaluate_translations (seq2seq-evaluate's path) gives.
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.evaluation import evaluate_translations, read_parallel, split_files
    from seq2seq.inference.runtimes import load_translator

    monkeypatch.chdir(workdir)
    config = load_checkpoint("run/checkpoints/best.pt")["config"]
    sources, references = read_parallel(*split_files(config, "valid"))
    translator = load_translator("run/checkpoints/best.pt")
    options = DecodeOptions(beam_size=best["beam_size"], length_penalty=best["length_penalty"])
    evaluation = evaluate_translations(translator, sources[:SENTENCES], references[:SENTENCES],
                                       options)
    assert evaluation.scores["bleu"] == pytest.approx(best["bleu"], abs=1e-9)
    # sacreBLEU's own ratio of the same output: what the cell reports.
    from sacrebleu.metrics import BLEU

    ratio = BLEU().corpus_score(evaluation.hypotheses, [references[:SENTENCES]]).ratio
    assert best["length_ratio"] == pytest.approx(ratio, abs=1e-12)


def test_several_checkpoints_are_tuned_as_one_ensemble(run_script, workdir):
    # An ensemble of a model with itself scores as that model: the grid is the same, and the
    # printed evaluate.py command names the whole ensemble.
    shutil.copy(workdir / "run/checkpoints/best.pt", workdir / "run/checkpoints/copy.pt")
    common = ["beam_sizes=[1,3]", "length_penalties=[1.0]", f"max_sentences={SENTENCES}",
              "device=cpu", "num_threads=1"]
    single = run_script(["checkpoint=run/checkpoints/best.pt", *common, "json=one.json"],
                        cwd=workdir)
    pair = run_script(["checkpoint=[run/checkpoints/best.pt,run/checkpoints/copy.pt]", *common,
                       "json=two.json"], cwd=workdir)
    assert single.returncode == 0 and pair.returncode == 0, single.stderr + pair.stderr
    one, two = (json.loads((workdir / name).read_text(encoding="utf-8"))
                for name in ("one.json", "two.json"))
    assert [c["bleu"] for c in two["cells"]] == pytest.approx([c["bleu"] for c in one["cells"]])
    assert two["checkpoint"] == ["run/checkpoints/best.pt", "run/checkpoints/copy.pt"]
    assert "seq2seq-evaluate 'checkpoint=[run/checkpoints/best.pt,run/checkpoints/copy.pt]'" \
        in pair.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["split=test"],
        ["src=corpus/test.src", "ref=corpus/test.tgt"],
    ],
    ids=["split-test", "test-files"],
)
def test_tuning_on_the_test_set_is_refused(run_script, workdir, args):
    result = run_script(
        ["checkpoint=run/checkpoints/best.pt", "beam_sizes=[1,3]", "length_penalties=[1.0]",
         *args],
        cwd=workdir,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "test" in lines[0] and "not allowed" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["beam_sizes=[0,3]"], "beam_size must be at least 1, got 0"),
        (["length_penalties=[a,b]"], "length_penalties: expected a list of numbers ([1,3,5]), "
                                     "got ['a', 'b']"),
        (["split=train"], "split must be valid, got 'train'"),
        (["src=corpus/valid.src"], "src and ref go together"),
        (["max_sentences=0"], "max_sentences must be positive, got 0"),
        (["beam_size=3"], "beam_size=3: tune-decoding tries every cell of beam_sizes x "
                          "length_penalties and returns the best translation; set those instead"),
    ],
)
def test_bad_arguments_are_one_line_errors(run_script, workdir, args, message):
    result = run_script(["checkpoint=run/checkpoints/best.pt", *args], cwd=workdir)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {message}"]


def test_the_previous_releases_flags_still_work_with_a_warning(run_script, workdir):
    result = run_script(["run/checkpoints/best.pt", "--beam-sizes", "1,3", "--length-penalties",
                         "1.0", "--max-sentences", str(SENTENCES), "--device", "cpu",
                         "--json", "old.json"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert ("write key=value: checkpoint='run/checkpoints/best.pt' beam_sizes=[1,3] "
            f"length_penalties=[1.0] max_sentences={SENTENCES} device=cpu json=old.json"
            in result.stderr)
    report = json.loads((workdir / "old.json").read_text(encoding="utf-8"))
    assert (report["beam_sizes"], report["length_penalties"]) == ([1, 3], [1.0])


def test_an_onnx_folder_is_tuned_as_evaluate_scores_it(run_script, workdir, monkeypatch,
                                                       exported_copy_model):
    """tune-decoding opens models as every decoding tool does: an exported folder too (the
    session's export of the copy model, copied beside its corpus)."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.evaluation import evaluate_translations, read_parallel, split_files
    from seq2seq.inference.runtimes import load_translator

    monkeypatch.chdir(workdir)
    shutil.copytree(exported_copy_model, "exported")
    result = run_script(["checkpoint=exported", "beam_sizes=[2]", "length_penalties=[1.0]",
                         f"max_sentences={SENTENCES}", "json=onnx.json"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    report = json.loads((workdir / "onnx.json").read_text(encoding="utf-8"))
    assert report["device"] == "cpu" and report["test_command"].startswith(
        "seq2seq-evaluate checkpoint=exported split=test")
    config = load_checkpoint("run/checkpoints/best.pt")["config"]
    sources, references = read_parallel(*split_files(config, "valid"))
    evaluation = evaluate_translations(load_translator("exported"), sources[:SENTENCES],
                                       references[:SENTENCES], DecodeOptions(beam_size=2))
    assert report["best"]["bleu"] == pytest.approx(evaluation.scores["bleu"], abs=1e-9)
