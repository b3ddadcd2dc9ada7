"""The reproduction recipes in scripts/: runnable alone, under sbatch and through make, with the
commands the Makefile ran before them.

No test trains: DRY_RUN=1 makes a script print its commands, and the member processes of
scripts/best.sh are a stand-in interpreter (PYTHON) that records its arguments.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
RUNNABLE = ["best.sh", "best_transformer.sh", "study.sh", "study_transformer.sh", "study_report.sh", "bench.sh",
            "bench_opennmt.sh"]
SOURCED = ["common.sh", "study_common.sh"]
# The environment knobs, cleared so that a test sees the defaults whatever the caller exported
# (make exports its command-line variables, MAKEFLAGS carries them to a nested make).
KNOBS = ["BEST_DIR", "BEST_SEEDS", "BEST_EXPERIMENTS", "BEST_TRANSFORMER_DIR", "BEST_MIXED_DIR", "STUDY_DIR", "STUDY_SEEDS", "STUDY_JOBS", "STUDY_SCORERS",
         "STUDY_SPARSEMAX", "STUDY_RECORDS", "STUDY_TRANSFORMER_STEPS", "PYTHON", "DRY_RUN",
         "ONMT_PATH", "SLURM_SUBMIT_DIR", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS"]

# What the Makefile ran before the scripts (and docs/study.md shows), interpreter left out.
STUDY_SWEEP = ["train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
               "hydra.sweep.dir=runs/attention_study", "trainer.num_threads=1",
               "trainer.resume=auto", "trainer.max_time=null", "trainer.valid_every=250",
               "trainer.precision=bf16", "trainer.seed=1,2,3,4,5"]
STUDY_TRAIN = STUDY_SWEEP + [
    "experiment=multi30k_luong_fast", "trainer.max_steps=4000", "trainer.early_stopping_patience=4",
    "hydra.sweep.subdir=${hydra:runtime.choices.model/attention}-${model.attention.normalizer}"
    "-seed${trainer.seed}"]
STUDY_REPORT = [
    ["compare.py", "runs/attention_study", "split=test", "records_dir=docs/attention_study/runs",
     "plots=false", "test=none", "aso_iterations=0"],
    ["compare.py", "docs/attention_study/runs", "split=test", "output_dir=docs/attention_study"],
]
SCORERS = "model/attention=gaussian,scaled_dot,additive,multihead,location,dot,general"


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in KNOBS}
    env.update(extra)
    return env


def run_script(name: str, *args: str, cwd: Path = ROOT, script: Path | None = None,
               **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(script or SCRIPTS / name), *args], cwd=cwd, env=clean_env(**env),
                          capture_output=True, text=True, timeout=60)


def commands(output: str) -> list[list[str]]:
    """The commands a dry run printed, each as its argv (comments and `wait` left out)."""
    lines = [line for line in output.splitlines() if line and not line.startswith("#")]
    return [shlex.split(line) for line in lines if line != "wait"]


def dry_run(name: str, *args: str, **env: str) -> list[list[str]]:
    result = run_script(name, *args, DRY_RUN="1", PYTHON="python", **env)
    assert result.returncode == 0, result.stderr
    return commands(result.stdout)


@pytest.mark.parametrize("name", RUNNABLE)
def test_each_script_is_an_executable_bash_job_with_usage_and_sbatch_lines(name):
    path = SCRIPTS / name
    assert os.access(path, os.X_OK), f"chmod +x scripts/{name}"
    subprocess.run(["bash", "-n", str(path)], check=True)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1].startswith(f"# Usage: scripts/{name}")
    # sbatch reads #SBATCH lines only above the first command.
    header = lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    for option in ("--job-name=", "--cpus-per-task=", "--time="):
        assert any(line.startswith(f"#SBATCH {option}") for line in header), option
    assert "set -euo pipefail" in lines


@pytest.mark.parametrize("name", SOURCED)
def test_the_sourced_helpers_parse(name):
    subprocess.run(["bash", "-n", str(SCRIPTS / name)], check=True)


def test_best_trains_two_members_side_by_side_then_tunes_their_ensemble():
    result = run_script("best.sh", "optimizer=adamw", DRY_RUN="1", PYTHON="python")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert lines[0] == "mkdir -p runs/best"
    members = [line for line in lines if line.endswith("&")]
    assert members == [
        f"python train.py experiment=multi30k_best trainer.num_threads=1 trainer.seed={seed} "
        f"hydra.run.dir=runs/best/seed{seed} optimizer=adamw > runs/best/seed{seed}.log 2>&1 &"
        for seed in (1, 2)]
    tune = shlex.split(lines[-1])
    assert tune == ["python", "-m", "seq2seq.cli.tune_decoding",
                    "checkpoint=[runs/best/seed1/checkpoints/best.pt,"
                    "runs/best/seed2/checkpoints/best.pt]",
                    "beam_sizes=[1,5,8]", "length_penalties=[1.0,1.4]"]


def test_best_takes_the_first_two_seeds_and_refuses_one():
    lines = run_script("best.sh", DRY_RUN="1", BEST_SEEDS="3 4 5", BEST_DIR="runs/best34").stdout
    assert "trainer.seed=3 hydra.run.dir=runs/best34/seed3" in lines
    assert "trainer.seed=4 hydra.run.dir=runs/best34/seed4" in lines
    assert "seed5" not in lines
    result = run_script("best.sh", DRY_RUN="1", BEST_SEEDS="3")
    assert result.returncode == 1
    assert "BEST_SEEDS needs two seeds" in result.stderr


def test_best_transformer_and_a_mixed_pair_train_their_experiments_in_named_folders():
    lines = run_script("best_transformer.sh", DRY_RUN="1", PYTHON="python").stdout.splitlines()
    members = [line for line in lines if line.endswith("&")]
    assert members == [
        f"python train.py experiment=multi30k_transformer trainer.num_threads=1 "
        f"trainer.seed={seed} hydra.run.dir=runs/best_transformer/seed{seed} "
        f"> runs/best_transformer/seed{seed}.log 2>&1 &" for seed in (1, 2)]
    lines = run_script("best.sh", DRY_RUN="1", PYTHON="python", BEST_DIR="runs/m", BEST_SEEDS="1 1",
                       BEST_EXPERIMENTS="multi30k_transformer multi30k_best").stdout.splitlines()
    members = [line for line in lines if line.endswith("&")]
    assert [shlex.split(line)[2] for line in members] == [
        "experiment=multi30k_transformer", "experiment=multi30k_best"]
    assert "hydra.run.dir=runs/m/transformer_seed1 > runs/m/transformer_seed1.log" in members[0]
    assert "hydra.run.dir=runs/m/best_seed1 > runs/m/best_seed1.log" in members[1]
    assert shlex.split(lines[-1])[3] == ("checkpoint=[runs/m/transformer_seed1/checkpoints/"
                                         "best.pt,runs/m/best_seed1/checkpoints/best.pt]")


@pytest.mark.parametrize(("experiments", "seeds", "message"), [
    ("multi30k_best", "1 2", "BEST_EXPERIMENTS needs two experiments"),
    ("multi30k_best multi30k_nope", "1 2", "no configs/experiment/multi30k_nope.yaml (one of: "),
    ("multi30k_best multi30k_best", "1 1", "both members would be runs/best/seed1"),
])
def test_best_refuses_a_pair_it_cannot_train(experiments, seeds, message):
    result = run_script("best.sh", DRY_RUN="1", BEST_EXPERIMENTS=experiments, BEST_SEEDS=seeds)
    assert result.returncode == 1 and message in result.stderr and not result.stdout


def test_study_runs_the_grid_then_sparsemax_then_the_report():
    assert dry_run("study.sh", "trainer.precision=fp32") == [
        ["python", *STUDY_TRAIN, SCORERS, "trainer.precision=fp32"],
        ["python", *STUDY_TRAIN, "model/attention=scaled_dot", "model.attention.normalizer=sparsemax",
         "trainer.precision=fp32"],
        *(["python", *command] for command in STUDY_REPORT),
    ]


def test_study_knobs_reach_every_command():
    grid, sparsemax, score, report = dry_run(
        "study.sh", STUDY_DIR="runs/s", STUDY_SEEDS="6", STUDY_JOBS="3", STUDY_SCORERS="dot",
        STUDY_SPARSEMAX="additive", STUDY_RECORDS="records")
    for sweep in (grid, sparsemax):
        assert {"hydra.sweep.dir=runs/s", "trainer.seed=6", "hydra.launcher.n_jobs=3"} <= set(sweep)
    assert "model/attention=dot" in grid
    assert "model/attention=additive" in sparsemax
    assert score[:3] == ["python", "compare.py", "runs/s"] and "records_dir=records" in score
    assert report[:3] == ["python", "compare.py", "records"]


def test_study_transformer_trains_to_the_end_of_its_schedule_then_reports():
    assert dry_run("study_transformer.sh", "x=1") == [
        ["python", *STUDY_SWEEP, "experiment=multi30k_transformer", "optimizer.lr=1.0e-3",
         "batch.max_tokens=2400", "model.encoder.ffn_dim=1024", "model.decoder.ffn_dim=1024",
         "trainer.max_steps=4000",
         "trainer.early_stopping_patience=null", "hydra.sweep.subdir=transformer-seed${trainer.seed}",
         "x=1"],
        *(["python", *command] for command in STUDY_REPORT),
    ]
    sweep = dry_run("study_transformer.sh", STUDY_TRANSFORMER_STEPS="6000")[0]
    assert "trainer.max_steps=6000" in sweep


def test_study_report_scores_then_rebuilds_and_takes_no_arguments():
    assert dry_run("study_report.sh") == [["python", *command] for command in STUDY_REPORT]
    assert run_script("study_report.sh", "x=1", DRY_RUN="1").returncode == 2


def test_bench_scripts_pass_their_options_on(tmp_path):
    assert dry_run("bench.sh", "--profile-steps", "0") == [
        ["python", "-m", "benchmarks.bench", "--profile-steps", "0"]]
    install, bench = dry_run("bench_opennmt.sh", "ckpt.pt", "--max-sentences", "10",
                             ONMT_PATH=str(tmp_path))
    assert install[:4] == ["python", "-m", "pip", "install"] and "opennmt-py==3.5.1" in install
    assert bench == ["python", "-m", "benchmarks.bench_opennmt", "--checkpoint", "ckpt.pt",
                     "--onmt-path", str(tmp_path), "--max-sentences", "10"]
    (tmp_path / "onmt").mkdir()  # installed already: not again
    assert dry_run("bench_opennmt.sh", "ckpt.pt", ONMT_PATH=str(tmp_path)) == [bench[:7]]
    assert run_script("bench_opennmt.sh", DRY_RUN="1").returncode == 2


def test_the_interpreter_defaults_to_the_virtual_environment():
    result = run_script("bench.sh", DRY_RUN="1")
    expected = ".venv/bin/python" if os.access(ROOT / ".venv/bin/python", os.X_OK) else "python"
    assert commands(result.stdout) == [[expected, "-m", "benchmarks.bench"]]


def test_scripts_run_from_any_folder_and_as_sbatch_copies(tmp_path):
    expected = dry_run("study_report.sh")
    # From another folder.
    result = run_script("study_report.sh", cwd=tmp_path, DRY_RUN="1", PYTHON="python")
    assert commands(result.stdout) == expected
    # sbatch runs a copy from its spool folder, in the folder the job was submitted from.
    spool = tmp_path / "spool"
    spool.mkdir()
    copy = spool / "slurm_script"
    shutil.copy(SCRIPTS / "study_report.sh", copy)
    for submitted_from in (ROOT, SCRIPTS):
        result = run_script("", cwd=submitted_from, script=copy, DRY_RUN="1", PYTHON="python",
                            SLURM_SUBMIT_DIR=str(submitted_from))
        assert commands(result.stdout) == expected, result.stderr
    result = run_script("", cwd=tmp_path, script=copy, DRY_RUN="1", SLURM_SUBMIT_DIR=str(tmp_path))
    assert result.returncode == 1 and "cannot find the repository root" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(("target", "variables", "script", "env"), [
    ("best", ['BEST_SEEDS=3 4', "BEST_DIR=runs/b", "ARGS=optimizer=adamw"], "best.sh",
     {"BEST_SEEDS": "3 4", "BEST_DIR": "runs/b"}),
    ("best-transformer", ["BEST_TRANSFORMER_DIR=runs/t"], "best_transformer.sh",
     {"BEST_DIR": "runs/t"}),
    ("best-mixed", [], "best.sh",
     {"BEST_DIR": "runs/best_mixed", "BEST_EXPERIMENTS": "multi30k_transformer multi30k_best"}),
    ("study", ["STUDY_SEEDS=6", "STUDY_SCORERS=dot", "ARGS=x=1"], "study.sh",
     {"STUDY_SEEDS": "6", "STUDY_SCORERS": "dot"}),
    ("study-transformer", ["STUDY_TRANSFORMER_STEPS=10", "STUDY_DIR=runs/t"],
     "study_transformer.sh", {"STUDY_TRANSFORMER_STEPS": "10", "STUDY_DIR": "runs/t"}),
    ("study-report", ["STUDY_RECORDS=records"], "study_report.sh", {"STUDY_RECORDS": "records"}),
])
def test_make_targets_run_the_scripts_with_their_variables(target, variables, script, env):
    # -o install: the virtual environment is taken as it is, never (re)installed here.
    result = subprocess.run(
        ["make", "-s", "-o", "install", target, "DRY_RUN=1", "PYTHON=/not/this/one", *variables],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    args = [v.removeprefix("ARGS=") for v in variables if v.startswith("ARGS=")]
    direct = run_script(script, *args, DRY_RUN="1", PYTHON=".venv/bin/python", **env)
    assert result.stdout == direct.stdout
    assert ".venv/bin/python " in result.stdout  # the venv's, not make's PYTHON (the base one)


def fake_python(tmp_path: Path) -> Path:
    """A stand-in interpreter: records its arguments, fails for FAKE_FAIL_SEED, sleeps on
    FAKE_SLEEP (as itself, so that killing it ends it)."""
    fake = tmp_path / "python"
    fake.write_text(
        '#!/usr/bin/env bash\n'
        'echo "$*" >> "$FAKE_CALLS"\n'
        'case " $* " in *" trainer.seed=${FAKE_FAIL_SEED:-none} "*) echo "seed failed"; exit 3;; esac\n'
        'if [[ -n ${FAKE_SLEEP:-} ]]; then echo $$ >> "$FAKE_PIDS"; exec sleep "$FAKE_SLEEP"; fi\n')
    fake.chmod(0o755)
    return fake


def best_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return dict(PYTHON=str(fake_python(tmp_path)), BEST_DIR=str(tmp_path / "best"),
                FAKE_CALLS=str(tmp_path / "calls"), FAKE_PIDS=str(tmp_path / "pids"), **extra)


def test_best_tunes_only_when_both_members_succeed(tmp_path):
    result = run_script("best.sh", **best_env(tmp_path))
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sorted(call.split()[3] for call in calls[:2]) == ["trainer.seed=1", "trainer.seed=2"]
    assert calls[2].startswith("-m seq2seq.cli.tune_decoding")

    (tmp_path / "calls").unlink()
    result = run_script("best.sh", **best_env(tmp_path, FAKE_FAIL_SEED="2"))
    assert result.returncode == 1
    best = tmp_path / "best"
    assert f"see the end of {best}/seed1.log and seed2.log" in result.stderr
    assert (best / "seed2.log").read_text() == "seed failed\n"
    assert not any("tune_decoding" in call for call in (tmp_path / "calls").read_text().splitlines())


def test_best_stops_both_members_when_stopped(tmp_path):
    env = clean_env(**best_env(tmp_path, FAKE_SLEEP="60"))
    process = subprocess.Popen([str(SCRIPTS / "best.sh")], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids_file = tmp_path / "pids"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pids_file.exists() and len(pids_file.read_text().split()) == 2:
            break
        time.sleep(0.05)
    members = [int(pid) for pid in pids_file.read_text().split()]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "a member failed" in stderr
    for pid in members:
        for _ in range(100):
            if not running(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"member {pid} still running")


def running(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not reaped yet, does not)."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
