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
tests/chat/test_template_tokens.py builds such a case).

An assistant turn given as data (SFT, `turn_ids`) is rendered the way the template renders a
conversation's last turn (with its reasoning: Qwen3 writes `<think>...</think>` there) and
kept as it is in the context of the turns after it, exactly as a sampled turn is. Templates
that re-render earlier turns differently at deployment (Qwen3 drops the reasoning of turns
before the last user message) therefore see other contexts than training: token-exact keeps
what was sampled (docs/environments.md, "Thinking models").

Every rendering goes through `render_chat`: messages whose `content` is null (an assistant
message that only calls tools, as OpenAI clients send it) are given an empty string, which
is what templates that test `content` for text expect, and `template_kwargs` (the config's
`chat_template_kwargs`, e.g. `{enable_thinking = false}`) reach the template as variables.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prime_rl.utils.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SENTINEL = "PRIME_RL_TURN_SENTINEL_8f2c"  # stands for the sampled content while rendering the tail
# Arguments of `apply_chat_template` itself: a template variable of that name would change how rendering works
# (`chat_template` would replace the template), so a config or request may not set them.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "self", "conversation", "conversations", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`kwargs` (or {}) when none of its keys is an argument of `apply_chat_template` itself, else ValueError."""
    reserved = sorted(set(kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)} (arguments of the renderer, not "
                         "template variables)")
    return dict(kwargs or {})


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with a null `content` as "" (an assistant message with only tool calls)."""
    return [{**m, "content": ""} if m.get("content", "") is None else m for m in messages]


TOOL_PROBE = "prime_rl_probe_tool_7c1e"  # a function name no template writes unless it renders the call


def renders_tool_calls(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template writes an assistant message's `tool_calls` (Qwen3's does; Llama 3's drops them, so a
    tool-call history would reach the model without its calls)."""
    call = {"id": "c0", "type": "function", "function": {"name": TOOL_PROBE, "arguments": {}}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    tools = [{"type": "function", "function": {"name": TOOL_PROBE, "parameters": {"type": "object", "properties": {}}}}]
    try:  # the tool is named in `tools` too, so its name in the text must come from the call unless tools render
        with_tools = render_chat(tokenizer, messages, tools, generation_prompt=False)
        tools_only = render_chat(tokenizer, messages[:1], tools, generation_prompt=False)
        return with_tools.count(TOOL_PROBE) > tools_only.count(TOOL_PROBE)
    except Exception:  # a template that raises on tool calls does not render them either
        return False


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template's text of `messages` (see the module docstring); a template error propagates."""
    return tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt, **(template_kwargs or {}))


class ChatTokens:
    """Renders chat messages with the served model's tokenizer and chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, template_kwargs: dict[str, Any] | None = None):
        if tokenizer.chat_template is None:
            raise UserError("the tokenizer has no chat template: multi-turn rollouts need one")
        self.tokenizer = tokenizer
        self.template_kwargs = check_template_kwargs(template_kwargs)
        eos = tokenizer.eos_token_id
        # A model may stop on any special token its generation config names (Llama 3: <|eot_id|>, <|eom_id|>
        # beside the tokenizer's eos): each one's text is dropped from the tail it opens.
        specials = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        self.end_of_turn = ({eos} if isinstance(eos, int) else set(eos or ())) | specials

    @classmethod
    def load(cls, path: str | Path, trust_remote_code: bool = False,
             template_kwargs: dict[str, Any] | None = None) -> ChatTokens:
        """The tokenizer of the model at `path` (the same files the server loads)."""
        from transformers import AutoTokenizer  # ~7 s to import: only a run with a multi-turn environment pays it

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except Exception as exc:  # transformers raises many types; the message is what matters
            raise UserError(f"cannot load the tokenizer of {path} for multi-turn rollouts: {exc}") from None
        return cls(tokenizer, template_kwargs)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool) -> str:
        try:
            return render_chat(self.tokenizer, messages, tools, generation_prompt, self.template_kwargs)
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

    def turn_ids(self, history: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """Token ids of the last message of `history` (an assistant turn given as data), rendered as the template
        renders a conversation's last turn, after the generation prompt of the messages before it: its reasoning,
        content, tool calls and end of turn (the ids `prompt_ids`/`reply_ids` leave for the policy to sample)."""
        before = self.render(history[:-1], tools, True)
        text = self.render(history, tools, False)
        if not text.startswith(before):
            raise UserError("the chat template renders the messages before an assistant turn differently once the "
                            "turn follows them: cannot place the turn's tokens")
        return self.encode(text[len(before):])
