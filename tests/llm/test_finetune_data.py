"""Fine-tuning examples to tokens and loss masks, checked token by token on hand-written examples."""

from __future__ import annotations

import numpy as np
import pytest
from chat_tokenizers import OWN, chatml_less, ids, rewriting, with_template, word_tokenizer

from tessera.llm.finetune import ExampleError, encode_record, fit, load_example_tokenizer
from tessera.llm.finetune.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplateError

CHAT = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "bye"},
                     {"role": "assistant", "content": "goodbye"}]}


def tokens_and_targets(tok, record, **options) -> tuple[list[int], list[int]]:
    """(token ids, the ids of the tokens that are targets)."""
    ex = encode_record(record, "auto", load_example_tokenizer(tok), **options)
    return ex.tokens.tolist(), ex.tokens[ex.loss].tolist()


def test_chat_without_template_uses_chatml_and_trains_on_every_reply() -> None:
    tok = chatml_less()
    assert load_example_tokenizer(tok).template == DEFAULT_CHAT_TEMPLATE
    tokens, targets = tokens_and_targets(tok, CHAT)
    assert tokens == ids(tok, "<|im_start|> system be brief <|im_end|> <|im_start|> user hi <|im_end|> "
                              "<|im_start|> assistant hello there <|im_end|> <|im_start|> user bye <|im_end|> "
                              "<|im_start|> assistant goodbye <|im_end|> <|endoftext|>")
    assert targets == ids(tok, "hello there <|im_end|> goodbye <|im_end|> <|endoftext|>")


def test_chat_last_assistant_and_all() -> None:
    tok = chatml_less()
    _, last = tokens_and_targets(tok, CHAT, loss_on="last_assistant")
    assert last == ids(tok, "goodbye <|im_end|> <|endoftext|>")
    tokens, everything = tokens_and_targets(tok, CHAT, loss_on="all")
    assert everything == tokens[1:]  # every token but the first, which nothing predicts


def test_chat_with_the_tokenizers_own_template() -> None:
    tok = with_template()
    tokens, targets = tokens_and_targets(tok, CHAT)
    # the template's BOS and its EOS after each reply; no second EOS appended
    assert tokens == ids(tok, "<s> <sys> be brief <user> hi <bot> hello there </s> <user> bye <bot> goodbye </s>")
    assert targets == ids(tok, "hello there </s> goodbye </s>")


def test_conversation_ending_with_a_user_turn_gets_an_eos_without_loss() -> None:
    tok = chatml_less()
    record = {"messages": CHAT["messages"][:4]}
    tokens, targets = tokens_and_targets(tok, record)
    assert tokens[-1] == tok.convert_tokens_to_ids("<|endoftext|>")
    assert targets == ids(tok, "hello there <|im_end|>")


def test_template_that_rewrites_earlier_turns_uses_generation_marks() -> None:
    tok = rewriting(generation=True)
    tokens, targets = tokens_and_targets(tok, {"messages": CHAT["messages"][1:]})
    assert tokens == ids(tok, "<sys> 4 <user> hi <bot> hello there </s> <user> bye <bot> goodbye </s>")
    assert targets == ids(tok, "hello there </s> goodbye </s>")
    _, last = tokens_and_targets(tok, {"messages": CHAT["messages"][1:]}, loss_on="last_assistant")
    assert last == ids(tok, "goodbye </s>")
    with pytest.raises(ChatTemplateError, match="generation"):
        tokens_and_targets(rewriting(generation=False), {"messages": CHAT["messages"][1:]})


def test_instruction_loss_on_the_response_or_both() -> None:
    tok = load_example_tokenizer("byte")
    ex = encode_record({"prompt": "ab", "response": "cd"}, "instruction", tok)
    assert ex.tokens.tolist() == [97, 98, 99, 100, 256]
    assert ex.loss.tolist() == [False, False, True, True, True]
    both = encode_record({"prompt": "ab", "response": "cd"}, "instruction", tok, loss_on="all")
    assert both.loss.tolist() == [False, True, True, True, True]


def test_text_records_train_on_every_token() -> None:
    tok = load_example_tokenizer("byte")
    ex = encode_record({"body": "xyz"}, "text", tok, text_field="body")
    assert ex.tokens.tolist() == [120, 121, 122, 256]
    assert ex.loss.tolist() == [False, True, True, True]


def test_auto_reads_the_form_off_the_keys_and_explicit_forms_need_their_keys() -> None:
    tok = load_example_tokenizer("byte")
    with pytest.raises(ExampleError, match="none of chat"):
        encode_record({"question": "?"}, "auto", tok)
    with pytest.raises(ExampleError, match="needs field"):
        encode_record({"text": "x"}, "instruction", tok)
    with pytest.raises(ExampleError, match="messages\\[0\\]"):
        encode_record({"messages": [{"content": "no role"}]}, "chat", tok)


def test_truncation_cuts_the_prompt_side_first() -> None:
    tok = load_example_tokenizer("byte")
    ex = encode_record({"prompt": "abcdef", "response": "xy"}, "instruction", tok)  # 6 + 2 + EOS = 9
    cut = fit(ex, 6, "prompt_first")
    assert cut is not None and cut.truncated
    # the prompt's start goes; the last prompt token stays as the response's context
    assert cut.tokens.tolist() == [99, 100, 101, 102, 120, 121, 256][-6:]
    assert cut.tokens[cut.loss].tolist() == [120, 121, 256]
    # a response longer than the row: the prompt goes but one token, then the response's end is cut
    long = encode_record({"prompt": "ab", "response": "uvwxyz"}, "instruction", tok)
    cut = fit(long, 4, "prompt_first")
    assert cut is not None and cut.tokens.tolist() == [98, 117, 118, 119]
    assert cut.loss.tolist() == [False, True, True, True]
    assert fit(ex, 6, "drop") is None
    assert fit(ex, 9, "drop") is ex


def test_truncated_text_keeps_its_start() -> None:
    tok = load_example_tokenizer("byte")
    cut = fit(encode_record({"text": "abcdef"}, "text", tok), 3, "prompt_first")
    assert cut is not None and cut.tokens.tolist() == [97, 98, 99]
    assert np.array_equal(cut.loss, [False, True, True])


def test_tokenizer_folder_round_trip(tmp_path) -> None:
    with_template().save_pretrained(tmp_path / "tok")
    tok = load_example_tokenizer(tmp_path / "tok")
    assert tok.has_own_template and tok.eos_id == with_template().convert_tokens_to_ids("</s>")
    assert tok.fingerprint() == load_example_tokenizer(with_template()).fingerprint()
    assert tok.fingerprint() != load_example_tokenizer(chatml_less()).fingerprint()


@pytest.mark.parametrize("make", [chatml_less, with_template])
def test_a_reply_that_opens_the_conversation_keeps_its_header_out_of_the_loss(make) -> None:
    tok = make()
    _, targets = tokens_and_targets(tok, {"messages": [{"role": "assistant", "content": "hello"},
                                                       {"role": "user", "content": "hi"}]})
    end = "<|im_end|>" if make is chatml_less else "</s>"
    assert targets == ids(tok, f"hello {end}")


def test_a_template_that_refuses_a_conversation_names_it() -> None:
    tok = word_tokenizer(OWN, eos="</s>", template="{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('no system turns') }}{% endif %}{{ m['content'] }} {% endfor %}")
    with pytest.raises(ChatTemplateError, match="no system turns"):
        tokens_and_targets(tok, CHAT)
