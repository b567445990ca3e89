"""SFT data: assistant-only loss mask from the chat template, JSONL records, packing, rank split."""

from __future__ import annotations

import json
from itertools import islice

import pytest

from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.trainer.sft.config import SFTConfig, SFTDataConfig
from prime_rl.trainer.sft.data import (
    SFTExample,
    conversation_stream,
    pack,
    read_conversations,
    rows_for_rank,
    sft_chat,
    skip,
    tokenize_conversation,
)
from prime_rl.utils.errors import UserError


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def trained_text(tok, sample: SFTExample) -> str:
    return tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])


def test_mask_covers_assistant_reply_and_end_of_turn_only(tok):
    messages = [{"role": "system", "content": "Reverse."}, {"role": "user", "content": "abc"},
                {"role": "assistant", "content": "cba"}]
    sample = tokenize_conversation(sft_chat(tok), messages)
    assert tok.decode(sample.input_ids).startswith("<|im_start|>system\nReverse.")
    assert trained_text(tok, sample) == "cba<|im_end|>"
    assert len(sample.input_ids) == len(sample.loss_mask)


def test_multi_turn_trains_every_assistant_turn(tok):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "yz"}]
    assert trained_text(tok, tokenize_conversation(sft_chat(tok), messages)) == "x<|im_end|>yz<|im_end|>"


def test_an_assistant_message_marked_train_false_is_context_only(tok):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x", "train": False},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "yz"}]
    sample = tokenize_conversation(sft_chat(tok), messages)
    assert trained_text(tok, sample) == "yz<|im_end|>"
    assert "<|im_start|>assistant\nx<|im_end|>" in tok.decode(sample.input_ids)


def test_no_assistant_message_is_an_error(tok):
    with pytest.raises(UserError, match="no assistant"):
        tokenize_conversation(sft_chat(tok), [{"role": "user", "content": "hi"}])


def test_jsonl_records(tmp_path, tok):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "abc", "completion": "cba"}),
        "",
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]}),
        json.dumps({"prompt": [{"role": "user", "content": "p"}],
                    "completion": [{"role": "assistant", "content": "c"}]}),
    ]))
    convs = read_conversations(path)
    assert len(convs) == 3
    assert convs[0] == [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}]
    assert trained_text(tok, tokenize_conversation(sft_chat(tok), convs[0])) == "cba<|im_end|>"


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"text": "no"}\n')
    with pytest.raises(UserError, match="bad.jsonl:2"):
        read_conversations(path)
    with pytest.raises(UserError, match="does not exist"):
        read_conversations(tmp_path / "missing.jsonl")


def test_streams_are_deterministic_and_resumable(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": str(i), "completion": "x"}) for i in range(5)))
    for config in (SFTDataConfig(path=path), SFTDataConfig(env="reverse-text")):
        first = list(islice(conversation_stream(config, seed=3), 12))
        assert first == list(islice(conversation_stream(config, seed=3), 12))
        assert list(islice(skip(conversation_stream(config, seed=3), 7), 5)) == first[7:]
    env_conv = next(conversation_stream(SFTDataConfig(env="reverse-text"), seed=0))
    assert env_conv[-1]["role"] == "assistant"
    assert env_conv[-1]["content"] == env_conv[-2]["content"][::-1]


def test_pack_respects_seq_len_and_restarts_positions():
    samples = [SFTExample(list(range(n)), [False] + [True] * (n - 1)) for n in (5, 4, 6, 3, 9)]
    rows = pack(samples, seq_len=10)
    assert [r.sample_lens.tolist() for r in rows] == [[5, 4], [6, 3], [9]]
    assert all(r.input_ids.numel() <= 10 for r in rows)
    assert rows[0].position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert rows[0].num_loss_tokens == 4 + 3
    (long_row,) = pack([SFTExample(list(range(15)), [True] * 15)], seq_len=10)
    assert long_row.input_ids.numel() == 10  # truncated


def test_rows_for_rank_pads_to_equal_counts():
    rows = pack([SFTExample([1, 2, 3], [False, True, True]) for _ in range(5)], seq_len=3)
    split = [rows_for_rank(rows, r, 2, pad_id=0) for r in range(2)]
    assert [len(s) for s in split] == [3, 3]
    assert split[1][-1].num_loss_tokens == 0
    assert sum(r.num_loss_tokens for s in split for r in s) == sum(r.num_loss_tokens for r in rows)


def test_config_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        SFTDataConfig()
    with pytest.raises(ValueError, match="exactly one"):
        SFTDataConfig(path="x.jsonl", env="reverse-text")
    with pytest.raises(ValueError, match="needs data.env"):
        SFTConfig(data=SFTDataConfig(path="x.jsonl"), eval={"interval": 5})


def trained_runs(tokenizer, sample) -> list[str]:
    """The decoded runs of trained tokens, in order."""
    runs, current = [], []
    for token, trained in zip(sample.input_ids, sample.loss_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


REASONING_TOOL_CONVERSATION = [
    {"role": "user", "content": "12*34?"},
    {"role": "assistant", "content": "<think>\nI should multiply.\n</think>\n\n", "tool_calls": [
        {"type": "function", "function": {"name": "multiply", "arguments": {"a": 12, "b": 34}}}]},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "<think>\nThe tool said 408.\n</think>\n\n408"},
    {"role": "user", "content": "and 2*3?"},
    {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n6"},
]


def test_qwen3_reasoning_and_tool_calls_train_as_the_data_says(qwen3_tokenizer_dir):
    """Every turn's reasoning trains, earlier turns included (Qwen3's template alone would drop the reasoning of
    turns before the last user message), and the sequence is the token-exact concatenation of the turns."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    sample = tokenize_conversation(sft_chat(tokenizer), REASONING_TOOL_CONVERSATION)
    runs = trained_runs(tokenizer, sample)
    assert runs == [
        '<think>\nI should multiply.\n</think>\n\n<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}'
        "\n</tool_call><|im_end|>",
        "<think>\nThe tool said 408.\n</think>\n\n408<|im_end|>",
        "<think>\nEasy.\n</think>\n\n6<|im_end|>",
    ]
    text = tokenizer.decode(sample.input_ids)
    assert text.startswith("<|im_start|>user\n12*34?<|im_end|>\n<|im_start|>assistant\n<think>")
    assert "<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text


@pytest.mark.slow
def test_enable_thinking_false_reaches_the_sft_prompt(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    off = tokenize_conversation(sft_chat(tokenizer, {"enable_thinking": False}), conversation)
    on = tokenize_conversation(sft_chat(tokenizer), conversation)
    assert trained_runs(tokenizer, off) == ["hello<|im_end|>"]  # the empty think block is the prompt's
    assert trained_runs(tokenizer, on) == ["<think>\n\n</think>\n\nhello<|im_end|>"]  # the template writes it


@pytest.mark.slow
def test_llama3_turns_end_with_eot_and_train_through_it(llama3_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama3_tokenizer_dir)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "again"}, {"role": "assistant", "content": "hello again"}]
    sample = tokenize_conversation(sft_chat(tokenizer), conversation)
    assert trained_runs(tokenizer, sample) == ["hello<|eot_id|>", "hello again<|eot_id|>"]
    assert tokenizer.decode(sample.input_ids).count("<|begin_of_text|>") == 1


@pytest.mark.slow
def test_special_tokens_inside_an_assistant_turn_are_content_not_its_end(qwen3_tokenizer_dir):
    """Code data holds `<|endoftext|>`; the char tokenizer marks "\\n\\n" unknown (a special token): the turn still
    trains to its template's closer and the next turn follows it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x <|endoftext|> y"},
                    {"role": "user", "content": "again"}, {"role": "assistant", "content": "z"}]
    sample = tokenize_conversation(sft_chat(tokenizer, {"enable_thinking": False}), conversation)
    assert trained_runs(tokenizer, sample)[0].endswith("x <|endoftext|> y<|im_end|>")
    char = build_char_tokenizer()
    sample = tokenize_conversation(sft_chat(char), [{"role": "user", "content": "q"},
                                                    {"role": "assistant", "content": "ab\n\ncd"}])
    assert trained_runs(char, sample)[-1].endswith("cd<|im_end|>")
