"""A scored token's text and bytes, for each kind of tokenizer the zoo ships.

`token_text` decodes one token alone; the bytes of the tokens of an answer
must join into exactly the text the server streams (`IncrementalDecoder`),
whether the tokenizer is byte-level BPE (a CJK character or an emoji split
over tokens), SentencePiece-style with byte fallback (`<0xF0>` pieces), or
one whose decoder drops the first word's space (Mistral's, Phi-3's).
"""

from __future__ import annotations

from typing import Any

import pytest

from fusebox_server.model.tiny_model import ensure_model
from fusebox_server.model.tokenization import IncrementalDecoder, load_tokenizer, token_text
from fusebox_server.zoo.release import ensure_zoo_model

ANSWERS = ["你好，今天天气很好 🚀 ok", " the  river bends", "x = 1\n\ty 🚀🚀"]


def _tokenizer(name: str) -> Any:
    return load_tokenizer(ensure_model("tiny") if name == "tiny" else ensure_zoo_model(name))


@pytest.mark.parametrize("name", ["tiny", "mistral", "gemma2"])
def test_the_bytes_of_an_answers_tokens_join_into_its_streamed_text(name: str) -> None:
    tokenizer = _tokenizer(name)
    escaped = 0
    for answer in ANSWERS:
        ids = tokenizer.encode(answer, add_special_tokens=False)
        decoder = IncrementalDecoder(tokenizer)
        streamed = "".join(decoder.push(token) for token in ids) + decoder.flush()
        parts = [token_text(tokenizer, token, index == 0) for index, token in enumerate(ids)]
        assert b"".join(raw for _, raw in parts).decode() == streamed, (name, answer)
        for text, raw in parts:
            if text.startswith("\\x"):  # part of a character: its bytes, escaped
                escaped += 1
                assert text == "".join(f"\\x{byte:02x}" for byte in raw)
            else:
                assert text.encode() == raw
    if name == "tiny":
        assert escaped, "no token split a character: the escape path went untested"
