"""Chat-template rendering to token ids for multi-turn rollouts (token in, token out).

A conversation's token ids are never re-rendered or re-tokenized: each turn extends the
ids of the turn before. The first prompt is `encode(template(prompt, generation prompt))`;
after the policy's turn (its sampled ids, kept as they are) come the ids of what the
template renders between the end of that turn's content and the next generation prompt:

    tail = template(history + [assistant: SENTINEL] + replies, generation prompt) after SENTINEL

i.e. the end of the assistant turn (e.g. ChatML's `<|im_end|>\\n`), the environment's
messages, and the next `<|im_start|>assistant\\n`. When the policy's last sampled token is
the eos or another special token (a model may stop on any its generation config names, e.g.
Llama 3's `<|eot_id|>`) whose text opens the tail, that text is dropped from the tail: the
policy already produced it. Only the tail is tokenized, alone, so the ids of everything
before it are exactly what the server sampled, whatever a re-tokenization of the whole
text would give (a tokenizer may merge characters across the boundary differently:
tests/orchestrator/test_chat_tokens.py builds such a case).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prime_rl.utils.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SENTINEL = "PRIME_RL_TURN_SENTINEL_8f2c"  # stands for the sampled content while rendering the tail


class ChatTokens:
    """Renders chat messages with the served model's tokenizer and chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        if tokenizer.chat_template is None:
            raise UserError("the tokenizer has no chat template: multi-turn rollouts need one")
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        # A model may stop on any special token its generation config names (Llama 3: <|eot_id|>, <|eom_id|>
        # beside the tokenizer's eos): each one's text is dropped from the tail it opens.
        specials = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        self.end_of_turn = ({eos} if isinstance(eos, int) else set(eos or ())) | specials

    @classmethod
    def load(cls, path: str | Path, trust_remote_code: bool = False) -> ChatTokens:
        """The tokenizer of the model at `path` (the same files the server loads)."""
        from transformers import AutoTokenizer  # ~7 s to import: only a run with a multi-turn environment pays it

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except Exception as exc:  # transformers raises many types; the message is what matters
            raise UserError(f"cannot load the tokenizer of {path} for multi-turn rollouts: {exc}") from None
        return cls(tokenizer)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except Exception as exc:  # a template error names the environment's messages
            raise UserError(f"the chat template cannot render the conversation: {type(exc).__name__}: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """Token ids of the first prompt, ending with the generation prompt."""
        return self.encode(self.render(messages, tools, True))

    def reply_ids(self, history: list[dict[str, Any]], replies: list[dict[str, Any]], tools: list[dict[str, Any]],
                  last_sampled: int | None) -> list[int]:
        """Token ids that follow the policy's sampled ids: the end of its turn, the environment's `replies`, and the
        next generation prompt. `history` is the conversation so far (prompt included) ending with the policy's turn;
        `last_sampled` the policy's last sampled token id."""
        text = self.render([*history[:-1], {"role": "assistant", "content": SENTINEL}, *replies], tools, True)
        if text.count(SENTINEL) != 1:
            raise UserError("the chat template does not render an assistant message's content once, as given: "
                            "multi-turn rollouts cannot place the environment's reply after the sampled tokens")
        tail = text[text.index(SENTINEL) + len(SENTINEL):]
        if last_sampled in self.end_of_turn:
            closer = self.tokenizer.decode([last_sampled])
            tail = tail.removeprefix(closer)
        return self.encode(tail)
