"""A text prompt to token ids, refused before it costs much when it cannot fit the context.

Tokenizing a 4 MiB text in full took 20 s and 1.6 GB only to be refused by the context check. Two
bounds refuse such a text early (`PromptText.encode`, a `PromptTooLong` naming the bound):

1. Characters: one token covers at most `longest` characters (the longest token string of the
   vocabulary, added tokens included: a byte-level BPE token's string has a character per byte, so at
   least as many as the text it covers; a SentencePiece token's string is its text plus a marker), so a
   text of more than context x longest characters has more tokens than fit. No tokenization at all.
2. Pieces: a text longer than `SURELY_FITS` characters per context token (more than any real text
   needs to fit) is first tokenized `PIECE_TOKENS` x context characters at a time, each piece cut just
   before a whitespace character, counting as it goes. Cutting a text before a whitespace character
   changes its tokens only next to the cut (the pre-tokenizers of byte-level BPE and SentencePiece
   start a word at its leading space), by at most `CUT_SLACK` tokens; so once sum(piece tokens) -
   CUT_SLACK x cuts exceeds the context the whole text cannot fit, and tokenizing stops there (a few
   contexts' worth of text, whatever the text's length). A text that passes is tokenized whole, as
   always: the pieces only ever refuse.

Both bounds assume the tokenizer keeps every character of the text (byte-level BPE as Qwen's and Llama 3's,
SentencePiece with byte fallback as Llama 2's: measured, at most 1 token changed per cut). A tokenizer that
drops or collapses whitespace (BERT's WordPiece, T5's SentencePiece) could see a text made mostly of
whitespace refused although its few tokens would fit; no causal model served here uses one.
"""

from __future__ import annotations

from prime_rl.utils.errors import UserError

SURELY_FITS = 8  # characters per token past which a text is counted in pieces first
PIECE_TOKENS = 2  # a piece is this many characters per context token
CUT_SLACK = 16  # the most tokens one cut before a whitespace character can remove
WHITESPACE_SEARCH = 1024  # characters searched back from a piece's end for a whitespace character


class PromptTooLong(UserError):
    """A text prompt with more tokens than the context holds (HTTP 400)."""


def longest_token_chars(tokenizer) -> int:
    """The most characters of text one token can stand for (module docstring, bound 1)."""
    return max(1, max(map(len, tokenizer.get_vocab())))


class PromptText:
    """Text prompts of one tokenizer for a context of `context_len` tokens."""

    def __init__(self, tokenizer, context_len: int):
        self.tokenizer, self.context_len = tokenizer, context_len
        self.longest = longest_token_chars(tokenizer)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` (no special tokens added); PromptTooLong when it cannot fit the context."""
        if len(text) > self.context_len * self.longest:
            raise PromptTooLong(f"the prompt ({len(text)} characters, so at least {-(-len(text) // self.longest)} "
                                f"tokens) exceeds the context length {self.context_len}")
        if len(text) > self.context_len * SURELY_FITS:
            self._count_in_pieces(text)
        return self._ids(text)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _count_in_pieces(self, text: str) -> None:
        """PromptTooLong as soon as the pieces counted so far prove the text cannot fit (bound 2)."""
        piece = self.context_len * PIECE_TOKENS
        start, counted, cuts = 0, 0, 0
        while start < len(text):
            end = cut_before_whitespace(text, start, start + piece)
            counted += len(self._ids(text[start:end]))
            if end < len(text):
                cuts += 1
            if counted - CUT_SLACK * cuts > self.context_len:
                raise PromptTooLong(f"the prompt (over {counted - CUT_SLACK * cuts} tokens in its first {end} of "
                                    f"{len(text)} characters) exceeds the context length {self.context_len}")
            start = end


def cut_before_whitespace(text: str, start: int, end: int) -> int:
    """`end`, moved back to just before the nearest whitespace character within WHITESPACE_SEARCH characters and
    after `start` (or kept where there is none); the text's length when `end` is past it."""
    if end >= len(text):
        return len(text)
    for at in range(end, max(end - WHITESPACE_SEARCH, start), -1):
        if text[at].isspace():
            return at
    return end
