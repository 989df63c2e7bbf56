"""A newcomer's mistakes get one clear error line, not a traceback or the wrong usage."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sessionroute.cli import main
from sessionroute.errors import TraceFormatError


def test_trace_format_error_survives_pickling() -> None:
    # compare's worker processes send it back to the parent pickled
    err = TraceFormatError("t.csv", 3, "row", "missing column")
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, TraceFormatError)
    assert str(back) == "t.csv:3: field 'row': missing column"
    assert (back.path, back.line, back.field, back.message) == (
        "t.csv",
        3,
        "row",
        "missing column",
    )


def test_broken_trace_in_parallel_runs_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "broken.csv"
    trace.write_text("a,b,c\n1,2\n", encoding="utf-8")
    argv = ["compare", "--workload", str(trace), "--policies", "round_robin,random"]
    rc = main([*argv, "--jobs", "2", "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert rc == 2
    assert "broken.csv:1: field 'row'" in err
    assert "Traceback" not in err and "BrokenProcessPool" not in err


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["compare", "--bogus"], "sessionroute compare"),
        (["compare", "a.toml", "b.toml"], "sessionroute compare"),
        (["bench", "engine", "--bogus"], "sessionroute bench engine"),
        (["emulate", "--bogus"], "sessionroute emulate"),
    ],
)
def test_unknown_flag_is_reported_by_the_subcommand(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"{prog}: error: unrecognized arguments: {argv[-1]}" in err
    assert err.startswith(f"usage: {prog} ")


def test_dry_run_refuses_an_unknown_workload_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text('[workload]\nkind = "nosuch"\n[[arms]]\npolicy = "round_robin"\n', "utf-8")
    rc = main(["compare", str(exp), "--dry-run"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""  # no plan printed
    assert "exp.toml: unknown workload kind 'nosuch'" in " ".join(captured.err.split())


def test_dry_run_refuses_an_unknown_workload_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = tmp_path / "exp.toml"
    body = '[workload]\nkind = "toy"\noptions = {{{}}}\n[[arms]]\npolicy = "random"\n'
    exp.write_text(body.format("sessions = 4"), "utf-8")
    assert main(["compare", str(exp), "--dry-run"]) == 0  # the control: a valid option
    capsys.readouterr()
    exp.write_text(body.format("bogus = 1"), "utf-8")
    assert main(["compare", str(exp), "--dry-run"]) == 2
    assert "workload 'toy': unknown option 'bogus'" in " ".join(capsys.readouterr().err.split())


def test_bench_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--replicas REPLICAS simulated replicas (default: 3)" in text
    assert "--seed SEED workload and policy seed (default: 0)" in text
    assert "--steps STEPS RL steps (swe-rl) (default: 20)" in text
    assert "(default: False)" not in text


def test_unusable_out_dir_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    out = blocker / "run"  # a directory cannot be created under a file
    rc = main(["compare", "--workload", "toy", "--policies", "random", "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2
    assert f"cannot create output directory {str(out)!r}" in err
    assert "random" not in err.split("error:")[0]  # no arm was started


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_malformed_trace_fails_before_any_arm_runs(
    dry_run: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace is read once up front: ``--dry-run`` refuses it too, and a real run fails
    before its progress bars (and before creating ``--out``)."""
    trace = tmp_path / "bad.csv"
    trace.write_text(
        "row,session,agent,turn,t,input_tokens,output_tokens,cached_tokens,match_row,"
        "api_time,think_time,model,stop\n"
        "0,1,0,0,0.0,71175,169,0,-1,7.34,0.0,0,tool_use\n"
        "1,1,0,1,19.0,abc,296,71168,0,9.19,12.0,0,tool_use\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    argv = ["compare", "--workload", str(trace), "--out", str(out)]
    rc = main([*argv, "--dry-run"] if dry_run else argv)
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert rc == 2
    assert "bad.csv:3: field 'input_tokens': not an integer: 'abc'" in err
    assert "100.0%" not in err and captured.out == ""
    assert not out.exists()


def test_steps_on_a_workload_without_steps_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", "--workload", "toy", "--steps", "3", "--dry-run"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2
    assert "--steps applies to the swe-rl workload only" in err and "'toy'" in err


def test_command_line_changes_are_noted_in_the_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["compare", "--steps", "2", "--policies", "random", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(changed on the command line: --steps 2, --policies random)" in out


def test_unknown_replica_profile_fails_the_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = tmp_path / "x.toml"
    exp.write_text(
        'name = "x"\n[workload]\nkind = "swe-rl"\nsteps = 2\n'
        '[replicas]\ncount = 3\nprofile = "nope"\n[[arms]]\npolicy = "consistent_hash"\n',
        encoding="utf-8",
    )
    rc = main(["compare", str(exp), "--dry-run"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2
    assert f"{exp}: unknown replica profile 'nope'" in err and "glm45air-h200-tp8" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "--steps", "-1"], "--steps must be >= 1, got -1"),
        (["compare", "--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["sweep", "--steps", "0"], "--steps must be >= 1, got 0"),
    ],
)
def test_a_bad_count_names_the_flag_typed(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--dry-run"] if argv[0] == "compare" else argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "workload.steps" not in err


def test_empty_policies_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--policies", " , ", "--dry-run"]) == 2
    assert "--policies needs at least one policy name" in capsys.readouterr().err


def test_policies_says_which_file_options_it_drops(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--policies", "consistent_hash_bounded_load,adaptive_sticky", "--dry-run"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    # the default experiment's bounded-load arm has c = 1.05; --policies runs the default c
    assert "consistent_hash_bounded_load runs with its default options" in err
    assert "(c = 1.05)" in err
    assert "c=1.05" not in captured.out  # the plan's arm line shows no option
    assert "1 run" not in captured.out and "2 runs" in captured.out


def test_policies_says_which_options_of_the_files_arms_it_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With FILE too the note names the file's arm (c = 1.25), not an arm of --policies."""
    path = tmp_path / "e.toml"
    path.write_text(
        'name = "e"\n[workload]\nkind = "toy"\n[[arms]]\nname = "b"\n'
        'policy = "consistent_hash_bounded_load"\npolicy_options = { c = 1.25 }\n'
    )
    policies = "consistent_hash_bounded_load,consistent_hash_bounded_load(c=1.5)"
    assert main(["compare", str(path), "--policies", policies, "--dry-run"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "not the file's arm 'b' (c = 1.25)" in err and "(c = 1.5)" not in err


def test_an_arms_bar_counts_time_from_its_first_progress_not_while_it_waits() -> None:
    import time

    from rich.console import Console

    from sessionroute.experiments.progress import RichReporter

    reporter = RichReporter(Console(file=None, quiet=True))
    update = reporter.start_run("queued arm")
    time.sleep(0.5)  # waiting for a free process slot
    task = reporter._progress.tasks[0]
    assert task.elapsed is None  # not started
    update(0.0)
    update(0.5)
    reporter.end_run("queued arm")
    assert task.finished and task.finished_time is not None and task.finished_time < 0.5


def test_a_busy_port_of_the_replicas_urls_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process listens on a port of ``[replicas] urls``: the live run says which port
    and where it is set (the brackets survive rich's markup), not asyncio's traceback."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        toml = tmp_path / "live.toml"
        toml.write_text(
            'name = "busy"\n[workload]\nkind = "toy"\n[workload.options]\nsessions = 2\n'
            f'[replicas]\ncount = 1\nurls = ["http://127.0.0.1:{port}"]\n'
            '[live]\nreplicas = "emulate"\n[[arms]]\npolicy = "round_robin"\n',
            encoding="utf-8",
        )
        rc = main(["compare", "--live", str(toml), "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "[replicas] urls" in err
    assert "Traceback" not in err
