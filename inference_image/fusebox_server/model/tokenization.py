"""One tokenizer per model, a bounded cache of encodings, and streaming detokenization.

Why: an unbounded per-prompt cache is one of the leaks Fusebox exists to
catch, so the LRU here is capped at `--tokenizer-cache-size` entries (0
turns it off), and the hot prompts (`--templates-file`) are encoded once at
start into a separate table that is counted but never evicted (re-encoded
when the file changes). The
tokenizer is loaded once per model directory and shared by every request;
there is no per-request loader or buffer.

`IncrementalDecoder` turns token ids into text pieces for SSE: byte-level
BPE splits a Chinese character over several tokens, so a piece is held back
while it ends in an incomplete UTF-8 sequence.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

REPLACEMENT_CHARACTER = "\ufffd"


class ChatTurn(Protocol):
    """One chat message as the chat template reads it (`openai_schema.ChatMessage` is one).

    A protocol, so the model layer never imports the OpenAI schema.
    """

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


class PromptEncoder:
    """Encodes prompts through templates, then a bounded LRU, then the tokenizer."""

    def __init__(self, tokenizer: Any, cache_size: int, templates: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self.cache_hits_total = 0
        self.template_hits_total = 0
        self._templates: dict[tuple[str, bool], tuple[int, ...]] = {}
        self.set_templates(templates)

    def set_templates(self, templates: Iterable[str]) -> None:
        """Encode the templates into a new table, then swap it in whole (readers never see
        half of it; the file watcher calls this off the event loop)."""
        table: dict[tuple[str, bool], tuple[int, ...]] = {}
        for template in templates:
            # Both ways a template arrives: as a lone chat user turn, and as a raw prompt.
            chat_text = self._apply_chat_template([{"role": "user", "content": template}])
            table[(chat_text, False)] = self.encode_uncached(chat_text, False)
            table[(template, True)] = self.encode_uncached(template, True)
        self._templates = table

    @property
    def cache_entries(self) -> int:
        return len(self._cache)

    def render_chat(self, messages: Sequence[ChatTurn]) -> str:
        return self._apply_chat_template([{"role": m.role, "content": m.content} for m in messages])

    def render_conversation(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> str:
        """Messages that may carry tool calls and results, and the tools, through the
        template (as transformers passes them: `tools=` in the OpenAI shape)."""
        return self._apply_chat_template([dict(m) for m in messages], tools)

    @cached_property
    def template_source(self) -> str:
        """The chat template's jinja text (the `tool_use` one where a tokenizer has several)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("tool_use") or template.get("default")
        return template if isinstance(template, str) else ""

    @cached_property
    def template_takes_tools(self) -> bool:
        """Whether the template reads a `tools` variable: one that does not would render a
        request's tools as nothing, and the model would never learn of them."""
        import jinja2
        from jinja2 import meta

        environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        try:
            parsed = environment.parse(self.template_source)
        except jinja2.TemplateError:  # a tag of transformers' own (`generation`): read the text
            return re.search(r"\btools\b", self.template_source) is not None
        return "tools" in meta.find_undeclared_variables(parsed)

    def _apply_chat_template(
        self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str:
        rendered = self.tokenizer.apply_chat_template(
            messages,
            tools=[dict(tool) for tool in tools] if tools else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(rendered)

    def encode_uncached(self, text: str, add_special_tokens: bool) -> tuple[int, ...]:
        encoding = self.tokenizer.backend_tokenizer.encode(
            text, add_special_tokens=add_special_tokens
        )
        return tuple(encoding.ids)

    def cut_to_tokens(self, text: str, limit: int) -> tuple[str, int]:
        """The longest prefix of `text` that ends at a token boundary, never inside a
        character, and encodes to at most `limit` tokens; with its token count.

        For a stored answer sent in place of a generated one (the canned answers):
        `max_tokens` caps it as it caps a generation.
        """
        encoding = self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) <= limit:
            return text, len(encoding.ids)
        # A token's start offset is where its character starts: bytes of one character
        # split over tokens share the span, so the cut drops that character whole.
        for first_left_out in range(limit, -1, -1):
            cut = text[: encoding.offsets[first_left_out][0]]
            count = len(self.encode_uncached(cut, False))
            if count <= limit:
                return cut, count
        return "", 0

    def encode(self, text: str, add_special_tokens: bool) -> tuple[int, ...]:
        key = (text, add_special_tokens)
        template = self._templates.get(key)
        if template is not None:
            self.template_hits_total += 1
            return template
        if self.cache_size > 0:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.cache_hits_total += 1
                return cached
        ids = self.encode_uncached(text, add_special_tokens)
        if self.cache_size > 0:
            self._cache[key] = ids
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ids


class IncrementalDecoder:
    """Yields the new text each token adds, holding back incomplete UTF-8.

    Decodes a short window (from the last emitted boundary) rather than the
    whole output each step, so a long generation costs linear time.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """The rest at the end of a generation, incomplete bytes included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.endswith(REPLACEMENT_CHARACTER) and not final:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's spelling of bytes as characters, reversed: character -> byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are
    spelt, in order, by the characters from U+0100 on.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet: dict[str, int] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(0x100 + shifted)] = byte
            shifted += 1
    return alphabet


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()
WORD_START = "\u2581"
"""SentencePiece's mark for a space before a word (`▁the`)."""


def token_text(tokenizer: Any, token_id: int, starts_text: bool = False) -> tuple[str, bytes]:
    """One token as (text, its own bytes), for log-probabilities.

    A token that is part of a character (byte-level BPE splits a Chinese
    character over tokens; sentencepiece falls back to `<0xE5>` byte tokens)
    does not decode alone: its bytes are read from its vocabulary spelling,
    and its text is those bytes escaped (`\\xe5\\x8f`), as OpenAI shows them.
    The bytes of consecutive tokens join into the generated text's UTF-8.
    SentencePiece decoders drop the space of a text's first word (`▁the`):
    a token that does not start the text (`starts_text`) keeps it.
    """
    text: str = tokenizer.decode([token_id])
    spelling = tokenizer.convert_ids_to_tokens(token_id)
    spaced = isinstance(spelling, str) and spelling.startswith(WORD_START)
    if spaced and not starts_text and not text.startswith(" "):
        text = " " + text
    if REPLACEMENT_CHARACTER not in text:
        return text, text.encode("utf-8")
    raw: bytes | None = None
    if isinstance(spelling, str):
        fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", spelling)
        if fallback is not None:
            raw = bytes([int(fallback.group(1), 16)])
        elif spelling and all(char in BYTE_LEVEL_ALPHABET for char in spelling):
            raw = bytes(BYTE_LEVEL_ALPHABET[char] for char in spelling)
    if raw is None:
        return text, text.encode("utf-8")
    return "".join(f"\\x{byte:02x}" for byte in raw), raw


def encodes_alike(first: Any, second: Any) -> bool:
    """Whether token ids from one tokenizer mean the same to the other: the same object
    (the fallback from the primary's directory shares it), or two loads of the same
    tokenizer and chat template (a fallback directory with a copy of the primary's).

    Only fast tokenizers, whose whole definition serialises, are compared; any other
    pair of distinct tokenizers is taken to differ.
    """
    if first is second:
        return True
    definitions = []
    for tokenizer in (first, second):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return False
        definitions.append((backend.to_str(), getattr(tokenizer, "chat_template", None)))
    return definitions[0] == definitions[1]
