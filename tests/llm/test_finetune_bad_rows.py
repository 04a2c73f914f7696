"""Bad fine-tuning data, as a new user would bring it: every bad row is refused with one line naming the
file and the line, through `tessera llm prep` and through `tessera train ... data.train.path=FILE`, before
anything is written or trained; `on_bad_row: skip` leaves bad rows out and counts them; a gzip file reads
as its plain twin; a 64 MB example is used (cut to the context) under an 8 GB address-space limit."""

from __future__ import annotations

import functools
import gzip
import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from hf_fixtures import chat_examples, chat_tokenizer, tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_helpers import WORDS, assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.finetune import reader
from tessera.llm.finetune.chat import load_example_tokenizer
from tessera.llm.finetune.examples import bounded, encode_row, fit
from tessera.llm.finetune.reader import BadRecord, ChunkRecords
from tessera.llm.finetune.rows import ExampleError, parse_row
from tessera.shards.sources import Chunk

runner = CliRunner()
GOOD = [json.dumps(e) for e in chat_examples(40)]
NULL = '{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "hi"}]}'
NOT_UTF8 = b'{"messages": [{"role": "user", "content": "a\xff"}]}'
GZ = gzip.compress("".join(f"{g}\n" for g in GOOD * 5).encode(), mtime=0)


def lines(*rows: str | bytes) -> bytes:
    return b"".join((r if isinstance(r, bytes) else r.encode()) + b"\n" for r in rows)


# name -> (file content, the line refused, what the message says)
BAD_FILES = {
    "null.jsonl": (lines(*GOOD[:5], NULL, *GOOD[5:]), 6, "messages[0].content: null, not text"),
    "deep.jsonl": (lines(*GOOD[:3], '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}", *GOOD[3:]), 4,
                   "nested too deeply"),
    "utf8.jsonl": (lines(*GOOD[:7], NOT_UTF8, *GOOD[7:]), 8,
                   f"not UTF-8 (invalid start byte at byte {NOT_UTF8.index(0xff)} of the line)"),
    "all-bad.jsonl": (lines(*['{"messages": "nope"}'] * 10), 1, "messages: Input should be a valid list"),
    "cut.jsonl.gz": (GZ[:len(GZ) // 2], None, "the gzip data ends or breaks here"),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("model") / "tiny")


def one_error_line(res, *needles: str) -> str:
    """Exit 1 (a bad row is a runtime failure: the options were right), one `error:` line, no traceback."""
    return assert_one_line_error(res, 1, *needles)


def prep(data: Path, out: Path, model: Path, *extra: str):
    return runner.invoke(app, ["llm", "prep", str(data), str(out), "--format", "chat", "--tokenizer", str(model),
                               "--seq-len", "128", "--val-fraction", "0", *extra])


def train(data: Path, model: Path, tmp: Path, *extra: str):
    return runner.invoke(app, ["train", "finetune-lora-tiny.yaml", f"model.pretrained={model}",
                               f"data.train.path={data}", f"data.train.prep_cache={tmp / 'cache'}",
                               f"save_folder={tmp / 'run'}", "max_duration=1ba", *extra])


def gz_line(content: bytes) -> int:
    """The line a cut gzip file breaks on: one past the last whole line it still decompresses."""
    return zlib.decompressobj(31).decompress(content).count(b"\n") + 1


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_bad_row_is_refused_naming_file_and_line(name: str, model: Path, tmp_path: Path) -> None:
    content, line, what = BAD_FILES[name]
    data = tmp_path / name
    data.write_bytes(content)
    line = line or gz_line(content)
    where = f"{data}, line {line}: "
    one_error_line(prep(data, tmp_path / "out", model), where, what)
    assert not (tmp_path / "out").exists()  # nothing written
    error = one_error_line(train(data, model, tmp_path), f"data.train.path: {where}", what)
    assert "on_bad_row" in error or name.endswith(".gz")  # says how to skip such rows (a cut file: no)
    assert not (tmp_path / "run").exists()  # nothing trained
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_skip_leaves_bad_rows_out_and_counts_them(model: Path, tmp_path: Path) -> None:
    data = tmp_path / "mixed.jsonl"
    data.write_bytes(lines(*GOOD[:5], NULL, *GOOD[5:9], "[" * 5000 + "]" * 5000, *GOOD[9:]))
    res = prep(data, tmp_path / "out", model, "--on-bad-row", "skip", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["records"], summary["bad_rows"], summary["examples"]) == (42, 2, 40)
    assert summary["first_bad_row"] == (f"{data}, line 6: messages[0].content: null, not text (only a "
                                        "tool-call turn, with tool_calls, may have none)")
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(lines(*GOOD))
    assert prep(clean, tmp_path / "clean-out", model, "--json").exit_code == 0
    assert_same_rows(tmp_path / "out", tmp_path / "clean-out")  # the same rows as without the bad ones


def test_nothing_left_fails_in_prep_and_in_a_recipe(model: Path, tmp_path: Path) -> None:
    data = tmp_path / "all-bad.jsonl"
    data.write_bytes(BAD_FILES["all-bad.jsonl"][0])
    first = f"first bad row: {data}, line 1: messages: Input should be a valid list"
    one_error_line(prep(data, tmp_path / "out", model, "--on-bad-row", "skip"),
                   f"{data}: no example left to train on, of 10 records (10 bad rows skipped)", first)
    one_error_line(train(data, model, tmp_path, "data.train.on_bad_row=skip"), "10 bad rows skipped", first)
    no_reply = tmp_path / "no-reply.jsonl"  # valid rows, nothing to learn from them: also nothing left
    no_reply.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 3)
    one_error_line(prep(no_reply, tmp_path / "out", model), "no example left", "3 without a reply to learn")
    assert not (tmp_path / "out").exists()


def test_fewer_rows_than_one_batch_says_how_many(model: Path, tmp_path: Path) -> None:
    data = tmp_path / "few.jsonl"
    data.write_bytes(lines(*GOOD[:3]))
    one_error_line(train(data, model, tmp_path), f"{data}: 3 examples make 1 packed rows of 128 tokens",
                   "fewer than one batch of 8 rows (global_train_batch_size)")


def test_gzip_reads_as_its_plain_twin(model: Path, tmp_path: Path) -> None:
    plain, packed = tmp_path / "a.jsonl", tmp_path / "a.jsonl.gz"
    plain.write_bytes(lines(*GOOD))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for src in (plain, packed):
        res = prep(src, tmp_path / src.name.replace(".", "-"), model, "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["examples"] == 40, res.output
    assert_same_rows(tmp_path / "a-jsonl", tmp_path / "a-jsonl-gz")
    # a corpus (token windows) does not read gzip: refused, where it made an empty dataset and exit 0
    res = runner.invoke(app, ["llm", "prep", str(packed), str(tmp_path / "corpus"), "--tokenizer", "byte"])
    one_error_line(res, f"{packed}: no documents read (1 files skipped as not UTF-8 text)")
    assert not (tmp_path / "corpus").exists()


def assert_same_rows(a: Path, b: Path) -> None:
    files = sorted(p.name for p in (a / "train").iterdir())
    assert files == sorted(p.name for p in (b / "train").iterdir())
    for name in files:
        if name != "index.json":
            assert (a / "train" / name).read_bytes() == (b / "train" / name).read_bytes(), name


def test_a_64mb_example_under_an_8gb_address_space(model: Path, tmp_path: Path) -> None:
    """Used, cut to the context (it aborted after 4-10 GB); with a lower max_record_bytes, refused unread."""
    data = tmp_path / "big.jsonl"
    big = {"messages": [{"role": "user", "content": "x " * (32 << 20)}, {"role": "assistant", "content": "ok"}]}
    data.write_bytes(lines(*GOOD[:2], json.dumps(big), *GOOD[2:]))
    driver = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (8_000_000 * 1024, 8_000_000 * 1024))
        from typer.testing import CliRunner
        from tessera.cli.main import app
        runner, out = CliRunner(), []
        for args in ({["llm", "prep", str(data), str(tmp_path / "out"), "--format", "chat", "--tokenizer",
                      str(model), "--seq-len", "128", "--json"]!r},
                     {["train", "finetune-lora-tiny.yaml", f"model.pretrained={model}", f"data.train.path={data}",
                       f"data.train.prep_cache={tmp_path / 'cache'}", f"save_folder={tmp_path / 'run'}",
                       "max_duration=1ba"]!r}):
            res = runner.invoke(app, args)
            out.append([res.exit_code, res.stdout, res.output])
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]  # -6 was the abort
    (prep_code, prep_out, _), (train_code, _, train_log) = json.loads(done.stdout.splitlines()[-1])
    assert prep_code == 0 and train_code == 0, train_log
    summary = json.loads(prep_out)
    assert (summary["examples"], summary["truncated"]) == (41, 1)
    assert "41 examples of 41 records" in train_log and "1 truncated" in train_log
    res = prep(data, tmp_path / "refused", model, "--max-record-bytes", "1mb")
    one_error_line(res, f"{data}, line 3: a record of {len(json.dumps(big)):,} bytes, over the limit of 1,048,576")


# --- the parts, on their own ---------------------------------------------------------------------------


@pytest.mark.parametrize(("record", "message"), [
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content: Input should be a valid string (got 5)"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role: Input should be 'system', 'developer'"),
    ({"messages": [{"content": "x"}]}, "messages[0].role: missing"),
    ({"messages": []}, "messages: List should have at least 1 item"),
    ({"prompt": None, "response": "x"}, "prompt: null, not text"),
    ({"body": "x" * 1000}, "a record with fields ['body'] is none of chat ('messages'), instruction"),
    ([1, 2], "a record must be a JSON object, got list"),
])
def test_row_problems_are_named_inside_the_row(record, message: str) -> None:
    with pytest.raises(ExampleError) as info:
        parse_row(record, "auto")
    assert str(info.value).startswith(message) and len(str(info.value)) < 200


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=300),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "bot", 3]), "content": JSON})


@settings(max_examples=150, deadline=None)
@given(st.one_of(JSON, st.fixed_dictionaries({"messages": st.lists(MESSAGE, max_size=3) | JSON}),
                 st.fixed_dictionaries({"prompt": JSON, "response": JSON})),
       st.sampled_from(["auto", "chat", "instruction", "text"]))
def test_any_json_is_a_row_or_one_short_line(record, fmt: str) -> None:
    """Whatever JSON a line holds: a typed row, or ExampleError in one line of bounded length."""
    try:
        row = parse_row(record, fmt)
    except ExampleError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)
        return
    texts = ([m.content for m in row.messages] if hasattr(row, "messages") else
             [row.prompt, row.response] if hasattr(row, "prompt") else [row.text])
    assert all(isinstance(t, str) for t in texts)  # never None, a number, a list: nothing trained as "None"


def test_a_tool_call_turn_may_have_null_content() -> None:
    row = parse_row({"messages": [{"role": "user", "content": "time?"},
                                  {"role": "assistant", "content": None, "tool_calls": [{"name": "clock"}]}]}, "chat")
    assert row.messages[1].for_template() == {"role": "assistant", "content": None, "tool_calls": [{"name": "clock"}]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from("abc"), st.text(max_size=30), max_size=2),
                          st.sampled_from([b"", b"  ", b"{", b"\xff\xfe", b"[1]", b'"\xc3'])), max_size=12),
       st.integers(1, 9), st.integers(8, 64))
def test_reader_finds_every_line_whatever_the_blocks(rows, block: int, limit: int) -> None:
    """Lines read in blocks of any size give what whole lines give, at the same positions."""
    raw = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    data = b"\n".join(raw)
    old, reader.BLOCK = reader.BLOCK, block
    try:
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
            f.write(data)
            f.flush()
            got = list(ChunkRecords(Chunk("jsonl", f.name, 0, len(data)), limit))
    finally:
        reader.BLOCK = old
    want = []
    for i, line in enumerate(raw):
        if len(line) > limit:
            want.append((i, "over"))
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            want.append((i, "utf8"))
            continue
        if text.strip():
            try:
                want.append((i, json.loads(text)))
            except json.JSONDecodeError:
                want.append((i, "json"))
    kinds = [(i, "over" if "over the limit" in r.reason else "utf8" if "UTF-8" in r.reason else "json")
             if isinstance(r, BadRecord) else (i, r) for i, r in got]
    assert kinds == want


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2500), min_size=4, max_size=4), st.sampled_from([16, 48]),
       st.sampled_from(["all_assistant", "last_assistant", "all"]), st.sampled_from(["prompt_first", "drop"]))
def test_cutting_long_texts_before_tokenizing_keeps_the_row(sizes, seq_len: int, loss_on: str,
                                                            truncation: str) -> None:
    """A record cut to the context before tokenizing (`bounded`) gives the tokens the whole record gives."""
    tok = _chat_tok()
    rng = np.random.default_rng(sum(sizes))
    text = [" ".join(rng.choice(WORDS, size=n)) for n in sizes]
    for record in ({"messages": [{"role": "system", "content": text[0]}, {"role": "user", "content": text[1]},
                                 {"role": "assistant", "content": text[2]}, {"role": "user", "content": text[3]}]},
                   {"prompt": text[0], "response": text[1]}, {"text": text[2]}):
        row = parse_row(record, "auto")
        whole = fit(encode_row(row, tok, loss_on), seq_len, truncation)
        cut = fit(encode_row(bounded(row, tok, seq_len, loss_on), tok, loss_on), seq_len, truncation)
        assert (whole is None) == (cut is None)
        if whole is not None and cut is not None:
            assert np.array_equal(whole.tokens, cut.tokens) and np.array_equal(whole.loss, cut.loss)
            assert whole.truncated == cut.truncated


@functools.cache
def _chat_tok():
    return load_example_tokenizer(chat_tokenizer())


def test_lines_are_numbered_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file cut into many chunks (byte ranges) still names the line of the file, not of its chunk."""
    from tessera.llm.finetune.prep import prep_examples
    from tessera.shards import sources

    monkeypatch.setattr(sources, "LINE_CHUNK", 300)  # a chunk every two or three lines
    data = tmp_path / "many.jsonl"
    data.write_bytes(lines(*GOOD[:29], NULL, *GOOD[29:35], "{", *GOOD[35:]))
    with pytest.raises(ExampleError, match=f"^{data}, line 30: messages\\[0\\].content: null"):
        prep_examples(data, tmp_path / "out", "byte", seq_len=64, fmt="chat")
    summary = prep_examples(data, tmp_path / "out", "byte", seq_len=64, fmt="chat", on_bad_row="skip")
    assert (summary.records, summary.bad_rows, summary.examples) == (42, 2, 40)
    assert summary.first_bad_row.startswith(f"{data}, line 30: ")
    monkeypatch.setattr(sources, "LINE_CHUNK", 4 << 20)
    whole = prep_examples(data, tmp_path / "whole", "byte", seq_len=64, fmt="chat", on_bad_row="skip")
    assert whole.to_dict() | {"out": "", "seconds": 0} == summary.to_dict() | {"out": "", "seconds": 0}
