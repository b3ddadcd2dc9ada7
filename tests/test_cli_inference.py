"""translate.py, evaluate.py and seq2seq-average, run as the user runs them (and serve.py and
seq2seq-tune-decoding, where a bad option must be refused before torch loads).

What the tools print is compared with what the Translator API gives for the same checkpoint
and options: the copy model trains a little differently on each CPU kind, so no test expects
a particular translation of it (evaluate's BLEU on sentences like its training data aside).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import api_lines

from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator
from seq2seq.inference.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
AVERAGE = ["-m", "seq2seq.cli.average"]  # what the seq2seq-average console script runs
# One thread: the test machine's cores are shared and the model is tiny.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}


def run_interpreter(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess:
    """A real ``python`` process: for what a preloaded one cannot show (which modules load)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=ENV,
        timeout=120,
    )


@pytest.fixture
def workdir(tmp_path, trained_checkpoint) -> Path:
    """A fresh folder holding a run with the copy model and the corpus it names (relatively)."""
    checkpoint = trained_checkpoint
    shutil.copytree(checkpoint.parents[1] / "corpus", tmp_path / "corpus")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, tmp_path / "run" / "checkpoints" / "best.pt")
    return tmp_path


def assert_no_hydra_folders(directory: Path) -> None:
    assert not (directory / "outputs").exists()
    assert not list(directory.rglob(".hydra"))
    assert not list(directory.glob("*.log"))


def test_translate_stdin_keeps_lines_in_order(run_tool, workdir):
    long_line = " ".join(["small tree"] * 150)  # 300 pieces, cut to 250 with a warning
    lines = ["red cat", "", "one two big house", long_line, "blue bird sun", "", "moon"]
    before = sorted(p.name for p in workdir.iterdir())
    result = run_tool(
        [str(ROOT / "translate.py"), "checkpoint=run/checkpoints/best.pt", "beam_size=3"],
        cwd=workdir,
        stdin="".join(f"{line}\n" for line in lines),
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout.split("\n")
    assert output[-1] == "" and len(output) == len(lines) + 1  # N lines, each newline-ended
    output = output[:-1]
    assert output[1] == output[5] == ""
    # In order, each the API's translation (the long line cut as the API cuts it).
    assert output == api_lines(workdir / "run/checkpoints/best.pt", lines, beam_size=3)
    assert "has 300 pieces: translating only its first 250" in result.stderr
    assert sorted(p.name for p in workdir.iterdir()) == before
    assert_no_hydra_folders(workdir)


def test_translate_nbest_text_files_and_attention_plots(run_tool, workdir):
    (workdir / "in.txt").write_text("green dog\n\nfish\n", encoding="utf-8")
    result = run_tool(
        [
            str(ROOT / "translate.py"),
            "checkpoint=run/checkpoints/best.pt",
            "input=in.txt",
            "output=out/translations.txt",
            "beam_size=3",
            "nbest=2",
            "attention_plot=plots",
        ],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    lines = (workdir / "out" / "translations.txt").read_text("utf-8").splitlines()
    assert len(lines) == 6  # nbest lines per input line
    scores = [float(line.split("\t")[0]) for line in lines]
    assert scores[0] >= scores[1] and scores[4] >= scores[5]
    assert lines[2:4] == ["0.0000\t", "-inf\t"]  # the empty line
    assert lines == api_lines(workdir / "run/checkpoints/best.pt", ["green dog", "", "fish"],
                              beam_size=3, nbest=2)
    assert sorted(p.name for p in (workdir / "plots").iterdir()) == [
        "line000001.png",
        "line000003.png",
    ]
    assert (workdir / "plots" / "line000001.png").read_bytes().startswith(b"\x89PNG")

    result = run_tool(
        [str(ROOT / "translate.py"), "checkpoint=run/checkpoints/best.pt", 'text="red, blue car"'],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == api_lines(workdir / "run/checkpoints/best.pt",
                                                   ["red, blue car"])
    assert_no_hydra_folders(workdir)


def test_translate_missing_checkpoint_is_one_line_error(run_tool, tmp_path):
    result = run_tool([str(ROOT / "translate.py"), "checkpoint=nowhere.pt"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == "error: checkpoint not found: nowhere.pt"
    assert_no_hydra_folders(tmp_path)


@pytest.mark.parametrize(("tool", "override", "message"), [
    ("translate", "beam_size=abc", "beam_size: expected an integer, got 'abc'"),
    ("translate", "length_penalty=high", "length_penalty: expected a number, got 'high'"),
    ("evaluate", "batch.max_tokens=lots", "batch.max_tokens: expected an integer, got 'lots'"),
    ("evaluate", "num_threads=two", "num_threads: expected an integer, got 'two'"),
    ("translate", "search=nucleus", "search must be one of beam, sample, got 'nucleus'"),
    ("translate", "top_p=0", "top_p must be in (0, 1], got 0"),
    ("evaluate", "temperature=-1", "temperature must be a positive number, got -1"),
    ("evaluate", "terms_ignore_case=maybe", "terms_ignore_case: expected true or false, "
                                            "got 'maybe'"),
])
def test_bad_option_value_is_refused_naming_the_key(trained_checkpoint, capsys, tool, override,
                                                    message):
    """The tools' run() on the config their Hydra app composes, in this process."""
    import importlib

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=tool, overrides=[f"checkpoint={trained_checkpoint}", override])
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"seq2seq.cli.{tool}").run(cfg)
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == f"error: {message}"


@pytest.mark.parametrize("tool", ["translate", "evaluate", "serve"])
def test_the_request_is_made_in_one_pass_before_a_model_loads(tmp_path, capsys, tool):
    """A value out of range and a malformed glossary are refused before any checkpoint is read:
    here the checkpoint is not one, and its error never comes."""
    import importlib

    from seq2seq.cli.common import compose

    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    terms = tmp_path / "terms.tsv"
    terms.write_text("Hund\tdog\nKatze cat\n", encoding="utf-8")
    where = f"models={{a: '{broken}'}}" if tool == "serve" else f"checkpoint={broken}"
    for override, message in [
        ("beam_size=0", "beam_size must be at least 1, got 0"),
        (f"terms={terms}", f"{terms}: line 2: expected SOURCE<TAB>TARGET, found 0 tabs"),
    ]:
        cfg = compose(tool, [where, override])
        run = importlib.import_module(f"seq2seq.cli.{tool}")
        with pytest.raises(SystemExit):
            run.build_app(cfg) if tool == "serve" else run.run(cfg)
        assert capsys.readouterr().err.strip() == f"error: {message}"


# Runs a script (or a module, as python -m does) as __main__ and says on stderr, at exit,
# whether torch was loaded at all.
REPORT_TORCH = (
    "import atexit, runpy, sys; atexit.register(lambda: print('torch loaded:', 'torch' in "
    "sys.modules, file=sys.stderr)); sys.argv = sys.argv[1:]; "
)
TORCH_REPORTER = REPORT_TORCH + "runpy.run_path(sys.argv[0], run_name='__main__')"
MODULE_TORCH_REPORTER = (
    REPORT_TORCH + "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize(("script", "args", "status", "message"), [
    ("evaluate.py", ["num_threads=two"], 1, "num_threads: expected an integer, got 'two'"),
    ("translate.py", ["beam_size=abc"], 1, "beam_size: expected an integer, got 'abc'"),
    ("serve.py", ["batch.max_tokens=lots"], 1,
     "batch.max_tokens: expected an integer, got 'lots'"),
    ("seq2seq.cli.tune_decoding", ["split=test"], 1,
     "tuning on the test split is not allowed: tune on split=valid (or your own src/ref dev "
     "files), then score the chosen setting on test once"),
    # A mistyped checkpoint path: the commonest mistake.
    ("translate.py", ["checkpoint=[{checkpoint},run/nowhere.pt]"], 1,
     "checkpoint not found: run/nowhere.pt"),
    ("evaluate.py", ["checkpoint=runs/nowhere"], 1, "checkpoint not found: runs/nowhere"),
    ("evaluate.py", ["checkpoint=run/checkpoints/*.ckpt"], 1,
     "no checkpoint file matches run/checkpoints/*.ckpt"),
    ("serve.py", ["models={a: '{checkpoint}', b: nowhere.pt}"], 1,
     "model b: checkpoint not found: nowhere.pt"),
    ("translate.py", ["top_k=many"], 1, "top_k: expected an integer, got 'many'"),
    ("evaluate.py", ["constraints=nowhere.txt"], 1, "constraints file not found: nowhere.txt"),
    ("serve.py", ["terms=nowhere.tsv"], 1, "terms file not found: nowhere.tsv"),
])
def test_bad_option_is_one_line_error_from_the_script_before_torch_loads(
    workdir, trained_checkpoint, script, args, status, message
):
    """A typo costs a fraction of a second, not torch's import (2.5 s on a slow CPU)."""
    args = [arg.replace("{checkpoint}", str(trained_checkpoint)) for arg in args]
    if script.startswith("seq2seq.cli"):  # a console script's module
        command = ["-c", MODULE_TORCH_REPORTER, script, f"checkpoint={trained_checkpoint}",
                   *args]
    else:
        if not any(arg.startswith(("checkpoint=", "models=")) for arg in args):
            args = [f"checkpoint={trained_checkpoint}", *args]
        command = ["-c", TORCH_REPORTER, str(ROOT / script), *args]
    result = run_interpreter(command, cwd=workdir)
    assert result.returncode == status, result.stderr
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"error: {message}", "torch loaded: False"]


def test_evaluate_bleu_equals_the_sacrebleu_command(run_tool, workdir):
    result = run_tool(
        [str(ROOT / "evaluate.py"), "checkpoint=run/checkpoints/best.pt", "beam_size=2"],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    hyp = workdir / "run" / "eval" / "best.test.beam2.hyp"
    summary = json.loads((workdir / "run" / "eval" / "best.test.beam2.json").read_text("utf-8"))
    assert len(hyp.read_text("utf-8").splitlines()) == summary["sentences"] == 60
    assert f"BLEU = {summary['bleu']:.2f}" in result.stdout
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in result.stdout
    assert "chrF2 = " in result.stdout and "generation" in result.stdout
    # The copy model copies ~99% of test sentences (like its training data) on any CPU kind:
    # BLEU well above 50 makes the comparison with sacrebleu below mean something.
    assert summary["bleu"] > 50

    sacrebleu = Path(sys.executable).with_name("sacrebleu")
    command = [str(sacrebleu), "corpus/test.tgt", "-i", str(hyp), "-b"]
    printed = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=True)
    assert float(printed.stdout) == round(summary["bleu"], 1)
    precise = subprocess.run(
        [*command, "-w", "4"], cwd=workdir, capture_output=True, text=True, check=True
    )
    assert float(precise.stdout) == pytest.approx(summary["bleu"], abs=1e-4)
    assert_no_hydra_folders(workdir)


def test_evaluate_run_folder_files_and_table(run_tool, workdir):
    checkpoints = workdir / "run" / "checkpoints"
    # A second checkpoint: the average of the model with itself (same weights).
    result = run_tool(
        [
            *AVERAGE,
            str(checkpoints / "best.pt"),
            str(checkpoints / "best.pt"),
            f"output={checkpoints / 'avg.pt'}",
        ],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    result = run_tool(
        [
            str(ROOT / "evaluate.py"),
            "checkpoint=run",
            "src=corpus/valid.src",
            "ref=corpus/valid.tgt",
            "beam_size=1",
            "output_dir=scores",
        ],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("checkpoint\n")[-1].splitlines()
    assert len(table) == 2 and {line.split()[-1] for line in table} == {
        "run/checkpoints/avg.pt",
        "run/checkpoints/best.pt",
    }
    assert sorted(p.name for p in (workdir / "scores").iterdir()) == [
        "avg.valid.src.beam1.hyp",
        "avg.valid.src.beam1.json",
        "best.valid.src.beam1.hyp",
        "best.valid.src.beam1.json",
    ]


def test_average_of_two_checkpoints_loads_and_translates(run_tool, tmp_path, trained_checkpoint,
                                                         copy_sentences):
    first = trained_checkpoint
    payload = load_checkpoint(first)
    generator = torch.Generator().manual_seed(0)
    payload["model"] = {
        name: tensor + 0.01 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in payload["model"].items()
    }
    second = tmp_path / "second.pt"
    torch.save(payload, second)
    output = tmp_path / "averaged.pt"
    result = run_tool(
        [
            *AVERAGE,
            str(first),
            str(second),
            f"output={output}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr

    averaged = load_checkpoint(output)
    assert "optimizer" not in averaged and averaged["averaged_from"] == [str(first), str(second)]
    expected = {name: (tensor + payload["model"][name]) / 2
                for name, tensor in load_checkpoint(first)["model"].items()}
    for name, tensor in expected.items():
        torch.testing.assert_close(averaged["model"][name], tensor)
    # It loads as a checkpoint and translates as the first model's network with those weights.
    model, tokenizers, _ = model_from_checkpoint(load_checkpoint(first))
    model.load_state_dict(expected)
    inputs = copy_sentences(10, seed=11)
    translated = load_translator(output).translate(inputs)
    want = Translator(model, tokenizers, device="cpu").translate(inputs)
    assert [n[0].text for n in translated] == [n[0].text for n in want]


def test_average_refuses_mismatched_shapes(run_tool, tmp_path, trained_checkpoint, make_checkpoint):
    first = trained_checkpoint
    bigger = make_checkpoint(tmp_path, decoder_hidden_size=48)
    result = run_tool(
        [
            *AVERAGE,
            str(first),
            str(bigger),
            f"output={tmp_path / 'out.pt'}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot average: ")
    assert "has shape" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("tool, extra", [("translate.py", ["text=red cat"]),
                                         ("evaluate.py", ["beam_size=1"])])
def test_decoding_tools_bound_the_matmul_setup_cache_and_leave_onednns(workdir, tool, extra):
    """They set LRU_CACHE_CAPACITY (bf16 memory, README "Training") but not oneDNN's kernel
    cache, which greedy search needs whole."""
    from seq2seq.onednn_caches import MATMUL_SETUP_CACHE, MATMUL_SETUP_CACHE_ENV, ONEDNN_CACHE_ENV

    report = (f"import atexit, os, runpy, sys; "
              f"[os.environ.pop(name, None) for name in ({MATMUL_SETUP_CACHE_ENV!r}, "
              f"{ONEDNN_CACHE_ENV!r})]; "
              f"atexit.register(lambda: print('CACHES', os.environ.get({MATMUL_SETUP_CACHE_ENV!r}), "
              f"os.environ.get({ONEDNN_CACHE_ENV!r}), file=sys.stderr)); "
              f"sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    result = run_interpreter(["-c", report, str(ROOT / tool), "checkpoint=run/checkpoints/best.pt",
                              *extra], cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert f"CACHES {MATMUL_SETUP_CACHE} None" in result.stderr


# -- terminology, prefixes and sampling (#55) -----------------------------------------------
STEERED = ["red cat", "", "blue bird sun", "one two", "big cat house"]
STEERED_CONSTRAINTS = ["moon", "", "fish\tsmall tree", "", "\t"]  # a lone TAB: no phrase
STEERED_PREFIXES = ["green", "sun", "", "sun moon", ""]
TERMS = "# source<TAB>target\ncat\tdog\nhouse\tbird\n"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_translate_constraints_prefix_and_terms_keep_to_their_lines(run_tool, workdir):
    """Line i of each file steers output i, whether the input comes from a file (counted first)
    or a stream, in chunks of one line or several; the output is the Translator's for the same
    phrases (the files' and the glossary's together) and prefixes."""
    write_lines(workdir / "in.txt", STEERED)
    write_lines(workdir / "c.txt", STEERED_CONSTRAINTS)
    write_lines(workdir / "p.txt", STEERED_PREFIXES)
    (workdir / "t.tsv").write_text(TERMS, encoding="utf-8")
    phrases = [["moon", "dog"], [], ["fish", "small tree"], [], ["dog", "bird"]]
    translator = load_translator(workdir / "run/checkpoints/best.pt")
    expected = [n_best[0].text for n_best in translator.translate(
        STEERED, DecodeOptions(beam_size=2), prefixes=STEERED_PREFIXES, constraints=phrases,
        return_attention=False)]
    for source, text, prefix, wanted in zip(STEERED, expected, STEERED_PREFIXES, phrases,
                                            strict=True):
        # An empty line is never decoded: its translation is empty, whatever its prefix.
        assert text.startswith(prefix) and all(phrase in text for phrase in wanted) or (
            not source and text == "")
    steering = ["checkpoint=run/checkpoints/best.pt", "beam_size=2", "constraints=c.txt",
                "prefix=p.txt", "terms=t.tsv"]
    from_file = run_tool([str(ROOT / "translate.py"), *steering, "input=in.txt", "chunk_lines=2"],
                         cwd=workdir)
    assert from_file.returncode == 0, from_file.stderr
    streamed = run_tool([str(ROOT / "translate.py"), *steering, "chunk_lines=1"], cwd=workdir,
                        stdin=(workdir / "in.txt").read_text("utf-8"))
    assert streamed.returncode == 0, streamed.stderr
    assert from_file.stdout.splitlines() == streamed.stdout.splitlines() == expected
    # Phrases cannot be asked of sampling: DecodeOptions' one check, before any file is read.
    sampled = run_tool([str(ROOT / "translate.py"), *steering, "search=sample"], cwd=workdir,
                       stdin="red cat\n")
    assert sampled.returncode == 1
    assert sampled.stderr.strip().splitlines()[-1] == (
        "error: constraints and terms need search=beam (sampling cannot promise a phrase)")


def test_translate_samples_as_the_translator_does(run_tool, workdir):
    options = {"search": "sample", "temperature": 2.0, "top_p": 0.9, "seed": 3}
    result = run_tool([str(ROOT / "translate.py"), "checkpoint=run/checkpoints/best.pt",
                       "nbest=3", "beam_size=1", *(f"{k}={v}" for k, v in options.items())],
                      cwd=workdir, stdin="".join(f"{line}\n" for line in STEERED))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == api_lines(workdir / "run/checkpoints/best.pt", STEERED,
                                                   nbest=3, beam_size=1, **options)


@pytest.mark.parametrize(("files", "arguments", "stdin", "message"), [
    ({"c.txt": ["moon", ""]}, ["constraints=c.txt", "input=in.txt"], None,
     "constraints file c.txt has 2 lines but the input has 3: give one line per input line"),
    ({"p.txt": ["moon", ""]}, ["prefix=p.txt"], 3,
     "prefix file p.txt has 2 lines but the input has more: give one line per input line"),
    ({"p.txt": ["red", "blue", "sun", "moon"]}, ["prefix=p.txt", "chunk_lines=2"], 3,
     "prefix file p.txt has more lines than the input (3): give one line per input line"),
    ({"c.txt": ["moon", "dog\tŽ", ""]}, ["constraints=c.txt", "input=in.txt"], None,
     "c.txt: line 2: constraint 'Ž' has a piece the model's target vocabulary lacks: it cannot "
     "be produced"),
    ({"p.txt": ["", "", "Ž"]}, ["prefix=p.txt"], 3,
     "p.txt: line 3: prefix 'Ž' has a piece the model's target vocabulary lacks: it cannot be "
     "produced"),
    ({"t.tsv": ["cat dog"]}, ["terms=t.tsv", "input=in.txt"], None,
     "t.tsv: line 1: expected SOURCE<TAB>TARGET, found 0 tabs"),
    ({"t.tsv": ["", "cat\tŽ"]}, ["terms=t.tsv", "text=red cat"], None,
     "t.tsv: line 2: target term 'Ž' has a piece the model's target vocabulary lacks: it cannot "
     "be produced"),
])
def test_a_file_that_does_not_fit_is_one_line_before_any_output(run_tool, workdir, files,
                                                                arguments, stdin, message):
    write_lines(workdir / "in.txt", STEERED[:3])
    for name, lines in files.items():
        write_lines(workdir / name, lines)
    result = run_tool([str(ROOT / "translate.py"), "checkpoint=run/checkpoints/best.pt",
                       "output=out.txt", *arguments], cwd=workdir,
                      stdin="" if stdin is None else "".join(f"{s}\n" for s in STEERED[:stdin]))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert "Traceback" not in result.stderr
    assert not (workdir / "out.txt").exists()  # all or nothing


def test_evaluate_scores_the_steered_split_and_its_term_use(run_tool, workdir):
    from seq2seq.inference.glossary import Glossary

    sources = (workdir / "corpus/test.src").read_text("utf-8").splitlines()
    constraints = ["moon"] + [""] * (len(sources) - 1)
    write_lines(workdir / "c.txt", constraints)
    (workdir / "t.tsv").write_text(TERMS, encoding="utf-8")
    result = run_tool([str(ROOT / "evaluate.py"), "checkpoint=run/checkpoints/best.pt",
                       "beam_size=2", "constraints=c.txt", "terms=t.tsv"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    stem = workdir / "run" / "eval" / "best.test.beam2.constrained"
    summary = json.loads(Path(f"{stem}.json").read_text("utf-8"))
    terms = Glossary.load(workdir / "t.tsv").constraints_for(sources)
    phrases = [list(dict.fromkeys(([c] if c else []) + t))
               for c, t in zip(constraints, terms, strict=True)]
    translator = load_translator(workdir / "run/checkpoints/best.pt")
    expected = [n[0].text for n in translator.translate(sources, DecodeOptions(beam_size=2),
                                                        constraints=phrases,
                                                        return_attention=False)]
    assert Path(f"{stem}.hyp").read_text("utf-8").splitlines() == expected
    required = sum(len(p) for p in phrases)
    assert required > 5  # the glossary's terms occur in the test split
    found = sum(phrase in text for text, p in zip(expected, phrases, strict=True) for phrase in p)
    assert (summary["required_phrases"], summary["term_use_rate"]) == (required, found / required)
    assert summary["terms"] == "t.tsv" and summary["constraints"] == "c.txt"
    assert f"term use:   {found / required:.1%} of {required} required phrases" in result.stdout
    assert not (workdir / "run" / "eval" / "best.test.beam2.hyp").exists()  # plain: untouched

    sampled = run_tool([str(ROOT / "evaluate.py"), "checkpoint=run/checkpoints/best.pt",
                        "search=sample", "seed=1", "top_k=2"], cwd=workdir)
    assert sampled.returncode == 0, sampled.stderr
    summary = json.loads((workdir / "run/eval/best.test.sample.json").read_text("utf-8"))
    assert (summary["search"], summary["seed"], summary["top_k"]) == ("sample", 1, 2)
    assert summary["term_use_rate"] is None and "term use" not in sampled.stdout

    write_lines(workdir / "c.txt", constraints[:2])
    short = run_tool([str(ROOT / "evaluate.py"), "checkpoint=run/checkpoints/best.pt",
                      "constraints=c.txt"], cwd=workdir)
    assert short.returncode == 1
    assert short.stderr.strip().splitlines()[-1] == (
        f"error: constraints file c.txt has 2 lines but the input has {len(sources)}: give one "
        "line per input line")
