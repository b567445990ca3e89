"""Token in, token out: the ids after a policy turn are the template's tail alone, and a conversation's ids are
the sampled ids as they were, even where re-tokenizing the rendered text would give other ids."""

from __future__ import annotations

import string

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.models.char_tokenizer import CHATML_TEMPLATE, build_char_tokenizer
from prime_rl.utils.errors import UserError


def merging_tokenizer() -> PreTrainedTokenizerFast:
    """Characters plus the merged token "ab" (BPE): "a" then "b" sampled apart re-tokenize as one "ab"."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = ["\n", *[c for c in string.printable if c.isprintable()]]
    vocab = {tok: i for i, tok in enumerate([*specials, *chars, "ab"])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<|endoftext|>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        unk_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_reply_ids_are_the_templates_tail_after_the_sampled_end_of_turn():
    tokenizer = build_char_tokenizer()
    chat = ChatTokens(tokenizer)
    prompt = [{"role": "user", "content": "abc"}]
    sampled = ids(tokenizer, "cba") + [tokenizer.eos_token_id]
    history = [*prompt, {"role": "assistant", "content": "cba"}]
    reply = [{"role": "tool", "content": "42"}]
    tail = chat.reply_ids(history, reply, [], sampled[-1])
    assert tokenizer.decode(tail) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    whole = chat.prompt_ids(prompt, []) + sampled + tail
    # With a character tokenizer, the ids equal the rendered conversation's.
    assert whole == ids(tokenizer, tokenizer.apply_chat_template([*history, *reply], tokenize=False,
                                                                 add_generation_prompt=True))


def test_a_turn_that_did_not_end_with_the_end_of_turn_token_gets_the_templates_closer():
    tokenizer = build_char_tokenizer()
    tail = ChatTokens(tokenizer).reply_ids([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                                           [{"role": "user", "content": "z"}], [], ids(tokenizer, "y")[0])
    assert tokenizer.decode(tail) == "<|im_end|>\n<|im_start|>user\nz<|im_end|>\n<|im_start|>assistant\n"


def test_sampled_ids_survive_where_retokenizing_the_text_would_change_them():
    tokenizer = merging_tokenizer()
    a, b, ab = (tokenizer.convert_tokens_to_ids(t) for t in ("a", "b", "ab"))
    chat = ChatTokens(tokenizer)
    prompt = [{"role": "user", "content": "xy"}]
    # The policy sampled "a" and "b" as two tokens, then end of turn.
    sampled = [a, b, tokenizer.eos_token_id]
    history = [*prompt, {"role": "assistant", "content": tokenizer.decode(sampled, skip_special_tokens=True)}]
    reply = [{"role": "user", "content": "again"}]
    token_exact = chat.prompt_ids(prompt, []) + sampled + chat.reply_ids(history, reply, [], sampled[-1])
    round_trip = ids(tokenizer, tokenizer.apply_chat_template([*history, *reply], tokenize=False,
                                                              add_generation_prompt=True))
    # Same text, different ids: re-tokenizing merges the sampled "a" "b" into "ab".
    assert tokenizer.decode(token_exact) == tokenizer.decode(round_trip)
    assert ab in round_trip and ab not in token_exact
    assert token_exact != round_trip
    # The token-exact ids hold the sampled ids at their place.
    start = len(chat.prompt_ids(prompt, []))
    assert token_exact[start:start + 3] == sampled


def test_a_template_that_drops_the_assistant_content_is_refused():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    with pytest.raises(UserError, match="does not render an assistant message's content once"):
        ChatTokens(tokenizer).reply_ids([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                                        [{"role": "user", "content": "z"}], [], None)


def test_a_tokenizer_without_a_chat_template_is_a_user_error():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        ChatTokens(tokenizer)


def test_a_turn_ended_by_another_special_token_than_eos_does_not_repeat_it():
    tokenizer = build_char_tokenizer()
    tokenizer.eos_token = "<|endoftext|>"  # the model stops on <|im_end|> (its generation config's), not the eos
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tail = ChatTokens(tokenizer).reply_ids([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                                           [{"role": "user", "content": "z"}], [], im_end)
    assert tokenizer.decode(tail) == "\n<|im_start|>user\nz<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_qwen3_template_variables_and_null_content_reach_every_rendering(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    chat = ChatTokens(AutoTokenizer.from_pretrained(qwen3_tokenizer_dir), {"enable_thinking": False})
    prompt = chat.tokenizer.decode(chat.prompt_ids([{"role": "user", "content": "hi"}], []))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    calls = [{"type": "function", "function": {"name": "f", "arguments": {}}}]
    turn = chat.tokenizer.decode(chat.turn_ids([{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": None, "tool_calls": calls}], []))
    assert turn == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'


@pytest.mark.parametrize("key", ["chat_template", "tokenize", "add_generation_prompt", "tools"])
def test_template_kwargs_that_are_renderer_arguments_are_refused(key):
    with pytest.raises(ValueError, match=f"may not set {key}"):
        ChatTokens(build_char_tokenizer(), {key: True})
