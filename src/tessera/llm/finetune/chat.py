"""Tokenizers for fine-tuning data: plain text, and conversations through a chat template.

Two kinds are accepted, behind one small interface (`ExampleTokenizer`):
- a transformers tokenizer (an object, or a local folder with `tokenizer_config.json`, loaded with
  `AutoTokenizer.from_pretrained`; nothing is downloaded): conversations are rendered by its own
  `apply_chat_template`, and special tokens written by the template (`<|im_start|>`, a BOS) are parsed as
  the special tokens they are;
- a Tessera tokenizer ("byte" or a tokenizer JSON, `tessera.llm.tokenizer`): text is encoded as plain text.

A tokenizer without a chat template gets `DEFAULT_CHAT_TEMPLATE`, ChatML (the format transformers itself
used as its default before templates became mandatory):

    <|im_start|>system\\nYou are terse.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n

When the tokenizer has no `<|im_start|>`/`<|im_end|>` tokens these markers are spelled out in ordinary
tokens, which trains and generates correctly, only less compactly.

Which tokens are the assistant's (`assistant_spans`): the conversation is rendered prefix by prefix
(messages[:1], messages[:2], ...) and each render must extend the previous one; the text one message adds
is that message's segment, and for an assistant message the part the template writes with
`add_generation_prompt=True` (its header, "<|im_start|>assistant\\n") is split off as prompt. Segments are
tokenized one by one, so the boundary between "prompt" and "response" tokens is exact by construction.
Templates that rewrite earlier turns (some strip past reasoning) break the prefix property; those that
mark replies with `{% generation %}` are then read through transformers' assistant-token mask instead,
and any other is refused with a message naming the problem.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.llm.tokenizer import EOS, Tokenizer, TokenizerError, load_tokenizer

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")

Message = dict[str, Any]
Segment = tuple[str, bool, int]  # (text, is it an assistant reply, index of the message it belongs to)


class ChatTemplateError(ValueError):
    """A conversation cannot be split into turns with this tokenizer's chat template; says why."""


class ExampleTokenizer:
    """Text to token ids, and conversations to segments, for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, name: str | None = None) -> None:
        self.hf = _is_transformers(tokenizer)
        self.inner = tokenizer
        self.name = name or getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "name", "tokenizer")
        own = getattr(tokenizer, "chat_template", None) if self.hf else None
        self.template: str = own if isinstance(own, str) and own else DEFAULT_CHAT_TEMPLATE
        self.has_own_template = self.template is not DEFAULT_CHAT_TEMPLATE
        if self.hf:
            eos = tokenizer.eos_token_id
            if eos is None:
                eos = tokenizer.convert_tokens_to_ids(EOS)
                if eos is None or eos == tokenizer.unk_token_id:
                    raise TokenizerError(f"{self.name}: the tokenizer has no EOS token (set eos_token)")
            self.eos_id: int = int(eos)
            self.vocab_size: int = len(tokenizer)
        else:
            self.eos_id, self.vocab_size = tokenizer.eos_id, tokenizer.vocab_size

    # --- text ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no BOS/EOS added (a template that wants a BOS writes it)."""
        if not text:
            return []
        if self.hf:
            return list(self.inner(text, add_special_tokens=False)["input_ids"])
        return self.inner.encode(text)

    def fingerprint(self) -> str:
        """A hash of everything that decides the token ids: the vocabulary and merges, the template, EOS."""
        h = hashlib.sha256()
        if self.hf:
            backend = getattr(self.inner, "backend_tokenizer", None)
            h.update((backend.to_str() if backend is not None else repr(sorted(self.inner.get_vocab().items())))
                     .encode())
        elif getattr(self.inner, "name", "") == "byte":
            h.update(b"tessera-byte")
        else:
            h.update(self.inner._tok.to_str().encode())  # the BPE's own JSON
        h.update(self.template.encode())
        h.update(str(self.eos_id).encode())
        return h.hexdigest()

    # --- conversations ------------------------------------------------------------------------------

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        if not messages:
            if not add_generation_prompt:
                return ""
            try:  # the header of a reply that opens the conversation
                return self._render([], True)
            except Exception:  # a template that needs a message (indexes messages[0]): no header then
                return ""
        return self._render(messages, add_generation_prompt)

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        from jinja2 import TemplateError

        try:
            return self._render_unchecked(messages, add_generation_prompt)
        except TemplateError as exc:  # the template's own checks (`raise_exception`: roles must alternate...)
            raise ChatTemplateError(f"the chat template of {self.name} refused the conversation: {exc}") from None

    def _render_unchecked(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if self.hf and messages:
            return self.inner.apply_chat_template(list(messages), chat_template=self.template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        # transformers' own renderer (apply_chat_template refuses an empty conversation), given the special
        # tokens a template may write (bos_token...) as apply_chat_template gives them
        from transformers.utils.chat_template_utils import render_jinja_template

        specials = dict(self.inner.special_tokens_map) if self.hf else {}
        rendered, _ = render_jinja_template([list(messages)], chat_template=self.template,
                                            add_generation_prompt=add_generation_prompt, **specials)
        return rendered[0]

    def segments(self, messages: Sequence[Message]) -> list[Segment] | None:
        """The conversation's text cut at message boundaries, assistant replies apart from their headers;
        None when the template does not render prefixes as prefixes (see the module docstring)."""
        out: list[Segment] = []
        done = ""
        for i, message in enumerate(messages):
            full = self.render(messages[:i + 1])
            if not full.startswith(done):
                return None
            if message.get("role") == "assistant":
                header = self.render(messages[:i], add_generation_prompt=True)
                if not header.startswith(done):
                    return None
                # the header is what both renders share (a template may add its header differently)
                cut = len(os.path.commonprefix([header, full]))
                cut = max(cut, len(done))
                out += [(full[len(done):cut], False, i), (full[cut:], True, i)]
            else:
                out.append((full[len(done):], False, i))
            done = full
        return [s for s in out if s[0]]

    def assistant_mask(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """(token ids, 1 for every assistant-reply token) through the template's `{% generation %}` marks."""
        if not (self.hf and _GENERATION_TAG.search(self.template)):
            raise ChatTemplateError(
                f"{self.name}: the chat template does not render a conversation's prefixes as prefixes of it "
                "(it rewrites earlier turns), and it has no {% generation %} marks to find the replies by; "
                "give the tokenizer a template of either kind (tokenizer.chat_template)")
        out = self.inner.apply_chat_template(list(messages), chat_template=self.template, tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
        return list(out["input_ids"]), list(out["assistant_masks"])


def _is_transformers(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "apply_chat_template") and hasattr(tokenizer, "convert_tokens_to_ids")


def load_example_tokenizer(spec: str | os.PathLike[str] | Any) -> ExampleTokenizer:
    """An `ExampleTokenizer` from "byte", a tokenizer JSON, a local transformers tokenizer folder, or an
    object (a transformers tokenizer or a Tessera `Tokenizer`)."""
    if isinstance(spec, ExampleTokenizer):
        return spec
    if not isinstance(spec, str | os.PathLike):
        return ExampleTokenizer(spec)
    path = Path(spec)
    if path.is_dir():
        if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise TokenizerError(f"{path}: a folder without tokenizer_config.json or tokenizer.json")
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers raises many kinds for an unreadable folder
            raise TokenizerError(f"{path}: not a transformers tokenizer folder ({exc})") from None
        return ExampleTokenizer(hf, name=str(path))
    tok: Tokenizer = load_tokenizer(path)
    return ExampleTokenizer(tok, name=os.fspath(spec))
