"""Word-level tokenizers built here (nothing downloaded), wrapped in transformers' PreTrainedTokenizerFast,
so that masks can be checked token by token: every word and every marker is one token."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

WORDS = ("system user assistant be brief hi hello there bye goodbye what is two plus four six ok a b c d e f g "
         "h i j k l m n o p q r s t u v w x y z").split()
CHATML = ["<|im_start|>", "<|im_end|>"]
OWN = ["<s>", "</s>", "<sys>", "<user>", "<bot>"]
# A template of the tokenizer's own (not ChatML): BOS first, replies end with EOS written by the template.
OWN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<user> {{ m['content'] }} "
    "{% elif m['role'] == 'assistant' %}<bot> {{ m['content'] }}{{ eos_token }} "
    "{% else %}<sys> {{ m['content'] }} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<bot> {% endif %}"
)
# A template that rewrites what comes before (the turn count first): only {% generation %} finds replies.
REWRITING_TEMPLATE = (
    "<sys> {{ messages | length }} {% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<bot> {% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %} "
    "{% else %}<user> {{ m['content'] }} {% endif %}{% endfor %}"
)


def word_tokenizer(specials: list[str], eos: str, bos: str | None = None,
                   template: str | None = None) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.decoders import WordPiece

    vocab = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *specials, *WORDS,
                                         *(str(n) for n in range(10))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = WordPiece()
    tok.add_special_tokens(["<|endoftext|>", *specials])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos, unk_token="[UNK]")
    if template is not None:
        hf.chat_template = template
    return hf


def chatml_less() -> PreTrainedTokenizerFast:
    """No chat template of its own (so the default, ChatML, applies); has ChatML's markers as tokens."""
    return word_tokenizer(CHATML, eos="<|endoftext|>")


def with_template() -> PreTrainedTokenizerFast:
    return word_tokenizer(OWN, eos="</s>", bos="<s>", template=OWN_TEMPLATE)


def rewriting(generation: bool = True) -> PreTrainedTokenizerFast:
    template = REWRITING_TEMPLATE if generation else REWRITING_TEMPLATE.replace(
        "{% generation %}", "").replace("{% endgeneration %}", "")
    return word_tokenizer(OWN, eos="</s>", template=template)


def ids(tok: PreTrainedTokenizerFast, words: str) -> list[int]:
    """Token ids of space-separated words and markers."""
    return [tok.convert_tokens_to_ids(w) for w in words.split()]
