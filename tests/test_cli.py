"""The `txv` command line as a user meets it: help text for every flag, choices listed, --version, the converters."""

from __future__ import annotations

import argparse

import pytest

from hf_txvariants.cli import build_parser, main


def _subparser(name):
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("command", ["demo", "train", "eval", "push", "convert", "upgrade-legacy"])
def test_every_flag_has_help(command):
    parser = _subparser(command)
    undocumented = [a.option_strings for a in parser._actions if a.option_strings and not (a.help or "").strip()]
    assert undocumented == []


def test_train_help_lists_choices_and_text_variants_only(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "{no,bf16,fp16}" in out and "peak learning rate" in out and "--trainer" in out
    variant_help = _subparser("train")._option_string_actions["--variant"].help
    assert "transfo-xl" in variant_help and "txv_image_transformer" not in variant_help


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("txv (hf-txvariants) ")


def test_convert_evaluate_names_a_bad_ids_file(tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 three")
    saved = tmp_path / "model"
    from hf_txvariants.training import build_config, build_model

    build_model(build_config("transfo-xl", 10, d_model=16, n_layer=1, n_head=2, mem_len=4)).save_pretrained(saved)
    assert main(["convert", "evaluate", "--model", str(saved), "--ids", str(ids), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "ids.txt" in err and "'three'" in err


def test_the_launcher_table_is_the_full_cli():
    """`txv --help` (answered by the launcher) lists exactly the commands the full command line has, with their help."""
    from hf_txvariants_commands import COMMANDS

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(action.choices) == list(COMMANDS)
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    assert helps == {name: help_text for name, (help_text, _) in COMMANDS.items()}


@pytest.mark.parametrize(("argv", "status"), [(["--help"], 0), (["--version"], 0), (["bogus"], 2), ([], 2)])
def test_help_version_and_a_bad_command_import_neither_torch_nor_the_models(argv, status):
    """What makes `txv --help` answer at once (timed in benchmarks/bench_cli_startup.py): nothing heavy is imported."""
    import subprocess
    import sys

    probe = (
        "import sys, hf_txvariants_launcher as launcher\n"
        f"try:\n    launcher.main({argv!r})\nexcept SystemExit as exit:\n    status = exit.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'hf_txvariants') if m in sys.modules]\n"
        "print('STATUS', status, 'HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == f"STATUS {status} HEAVY []", result.stdout + result.stderr
    if status == 2:  # one line naming the problem, as every txv error
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("txv: error: ")


def test_a_command_runs_through_the_full_cli(capsys):
    from hf_txvariants_launcher import main as launcher

    assert launcher(["eval"]) == 2
    assert capsys.readouterr().err.strip() == "txv: error: txv eval: the following arguments are required: --model"
