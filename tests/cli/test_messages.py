"""One-line CLI errors that tell the user what to type: URL typos, the CLI spelling of a writer mode,
and `--debug` given to the root command."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.storage.errors import InvalidURL
from tessera.storage.url import parse_url

runner = CliRunner()


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(("url", "fix"), [("s3:/bucket/x", "s3://bucket/x"), ("s3:bucket", "s3://bucket"),
                                          ("gs:/b/p", "gs://b/p"), ("AZ:/c", "AZ://c")])
def test_a_scheme_with_one_slash_is_refused_not_a_local_folder(url: str, fix: str) -> None:
    with pytest.raises(InvalidURL, match=f"write {fix}"):
        parse_url(url)


def test_local_paths_with_a_colon_still_work(tmp_path: Path) -> None:
    assert parse_url(f"{tmp_path}/s3:x").is_local and parse_url("./s3:x").is_local
    assert parse_url("s3x:/a").is_local  # not a scheme Tessera knows


def test_url_typo_from_the_cli_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["storage", "ls", "s3:/bucket/x"])
    assert result.exit_code == 2 and "Traceback" not in result.output  # a usage error
    assert len(error_lines(result)) == 1 and "s3://bucket/x" in error_lines(result)[0]
    assert list(tmp_path.iterdir()) == []


def test_converting_into_an_existing_dataset_suggests_the_cli_option(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "a"}\n')
    assert runner.invoke(app, ["data", "convert", str(src), str(tmp_path / "ds")]).exit_code == 0
    result = runner.invoke(app, ["data", "convert", str(src), str(tmp_path / "ds")])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "--mode append" in line and "--mode overwrite" in line and "mode='" not in line


def test_debug_is_an_option_of_the_root_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    plain = runner.invoke(app, ["train", "tiny-cpu.yaml", "max_duration=abc"])
    assert plain.exit_code == 2 and len(error_lines(plain)) == 1
    for args in (["--debug", "train", "tiny-cpu.yaml", "max_duration=abc"],
                 ["train", "tiny-cpu.yaml", "max_duration=abc", "--debug"],
                 ["--debug", "storage", "ls", "s3:/bucket/x"]):
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and result.exception is not None, args
        assert not isinstance(result.exception, SystemExit), args
    again = runner.invoke(app, ["storage", "ls", "s3:/bucket/x"])  # the root flag does not stick
    assert isinstance(again.exception, SystemExit) or again.exception is None


def test_prep_into_an_existing_dataset_suggests_its_only_option(tmp_path: Path) -> None:
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("hello world " * 200)
    args = ["llm", "prep", str(tmp_path / "texts"), str(tmp_path / "tokens"), "--tokenizer", "byte",
            "--seq-len", "16"]
    assert runner.invoke(app, args).exit_code == 0
    (line,) = error_lines(runner.invoke(app, args))
    assert line.endswith("pass --overwrite to replace it") and "mode" not in line
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0


def test_repair_of_a_sound_index_suggests_the_cli_flag(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "a"}\n')
    assert runner.invoke(app, ["data", "convert", str(src), str(tmp_path / "ds")]).exit_code == 0
    (line,) = error_lines(runner.invoke(app, ["data", "repair", str(tmp_path / "ds")]))
    assert "--overwrite" in line and "overwrite=True" not in line
