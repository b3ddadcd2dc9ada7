"""seq2seq-plot-curves: validation BLEU of runs, read from their TensorBoard logs."""

from __future__ import annotations

import pytest

from seq2seq.cli.plot_curves import main, validation_curve


def write_run(folder, bleus: list[float]):
    """A run folder whose TensorBoard log has a training loss and these validation BLEUs."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "tensorboard"))
    writer.add_scalar("train/loss", 5.0, 1)
    for step, bleu in enumerate(bleus, start=1):
        writer.add_scalar("valid/bleu", bleu, 10 * step)
    writer.close()
    return folder


def test_each_validation_is_a_point_and_the_figure_is_written(tmp_path, capsys):
    first = write_run(tmp_path / "first", [1.0, 5.0, 9.5])
    second = write_run(tmp_path / "second", [2.0])
    minutes, bleu = zip(*validation_curve(first), strict=True)
    assert bleu == (1.0, 5.0, 9.5)
    assert list(minutes) == sorted(minutes) and minutes[0] >= 0

    output = tmp_path / "figures" / "curves.png"
    main([str(first), str(second), f"output={output}"])
    assert output.read_bytes().startswith(b"\x89PNG")
    assert f"written {output}" in capsys.readouterr().out


def test_the_previous_releases_output_flag_still_works(tmp_path, capsys):
    run = write_run(tmp_path / "run", [1.0])
    main([str(run), "--output", str(tmp_path / "old.png")])
    assert (tmp_path / "old.png").read_bytes().startswith(b"\x89PNG")
    assert f"write key=value: runs='{run}' output={tmp_path / 'old.png'}" in \
        capsys.readouterr().err


def test_a_folder_without_validation_scores_is_a_one_line_error(tmp_path, capsys):
    no_log = tmp_path / "empty"
    no_log.mkdir()
    no_validation = write_run(tmp_path / "early", [])
    for folder, message in ((no_log, "no tensorboard/ folder"),
                            (no_validation, "no valid/bleu scalars")):
        with pytest.raises(SystemExit, match="1"):
            main([str(folder), f"output={tmp_path / 'x.png'}"])
        err = capsys.readouterr().err
        assert err.startswith(f"error: {folder}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(SystemExit, match="1"):
        main([str(write_run(tmp_path / "run", [1.0])), f"output={tmp_path / 'x.xyz'}"])
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'x.xyz'}: ") and err.count("\n") == 1
    assert not (tmp_path / "x.xyz").exists()


def test_runs_of_one_name_are_told_apart_and_the_extension_names_the_format(tmp_path, capsys):
    first = write_run(tmp_path / "a" / "seed1", [1.0, 2.0])
    second = write_run(tmp_path / "b" / "seed1", [3.0, 4.0])
    output = tmp_path / "curves.svg"
    main([str(first), str(second), f"output={output}"])
    figure = output.read_text(encoding="utf-8")
    assert figure.lstrip().startswith("<?xml") and "<svg" in figure
    assert str(first) in figure and str(second) in figure
