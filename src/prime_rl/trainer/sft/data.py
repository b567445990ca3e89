"""SFT data: conversations from a JSONL file or an environment, tokenized with the chat
template (loss mask on assistant tokens only), packed into rows of at most `seq_len` tokens.

Assistant mask: for the i-th message with role `assistant` (unless it has `"train": false`,
which makes it context only, e.g. a flawed first attempt in a multi-turn demonstration), the tokens between
`template(messages[:i], add_generation_prompt=True)` and `template(messages[:i + 1])`
train, cut after the first end-of-turn (eos) token, so the model learns to stop and not
the template's trailing newline. This relies on the template rendering a conversation
as the concatenation of its turns (true for ChatML-style templates); it is checked.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.envs.data_files import load_rows
from prime_rl.trainer.sft.config import SFTDataConfig
from prime_rl.utils.errors import UserError

Messages = list[dict[str, str]]


@dataclass
class SFTExample:
    """One tokenized SFT conversation: its ids and which of them train (the assistant tokens). Not the
    orchestrator's `batch.Sample`, a rollout sample of the RL batch file."""

    input_ids: list[int]
    loss_mask: list[bool]


@dataclass
class Row:
    """One packed row: examples end to end; position ids restart per example."""

    input_ids: torch.Tensor  # long [T]
    position_ids: torch.Tensor  # long [T]
    sample_lens: torch.Tensor  # long [S]
    loss_mask: torch.Tensor  # bool [T]

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


# ------------------------------------------------------------------------------ sources


def _as_messages(value, role: str, where: str) -> Messages:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return value
    raise UserError(f"{where}: expected a string or a list of {{role, content}} messages")


def record_to_messages(record: dict, where: str) -> Messages:
    """A data row (`messages`, or `prompt` + `completion` or `answer`) as one chat conversation."""
    if "messages" in record:
        return _as_messages(record["messages"], "user", where)
    reply = "completion" if "completion" in record else "answer"
    if "prompt" in record and reply in record:
        return _as_messages(record["prompt"], "user", where) + _as_messages(record[reply], "assistant", where)
    raise UserError(f"{where}: a record needs 'messages' or 'prompt' and 'completion' (or 'answer') "
                    f"(got keys {sorted(record)})")


def read_conversations(path: Path) -> list[Messages]:
    """Every row of a data file or directory (`envs/data_files.py`: JSONL, JSON, CSV, parquet) as a conversation."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"SFT data file {path} does not exist")
    return [record_to_messages(row, str(ref)) for row, ref in load_rows(path)]


def conversation_stream(config: SFTDataConfig, seed: int) -> Iterator[Messages]:
    """Infinite, deterministic stream of conversations (the same seed gives the same stream).

    A data file: epochs over its rows, each shuffled with `random.Random(seed + epoch)`.
    Environment: its examples, each prompt followed by the environment's `demonstration` (the reference
    answer as the assistant reply; the whole ideal conversation for a multi-turn environment).
    """
    if config.path is not None:
        data = read_conversations(config.path)
        epoch = 0
        while True:
            order = list(range(len(data)))
            random.Random(seed + epoch).shuffle(order)
            yield from (data[i] for i in order)
            epoch += 1
    from prime_rl.envs import load_env

    env = load_env(config.env, **config.env_args)
    for example in env.examples(seed):
        yield [*example.prompt, *env.demonstration(example)]


def skip(stream: Iterator, n: int) -> Iterator:
    """`stream` without its first `n` items (resume continues where the run stopped)."""
    next(islice(stream, n, n), None)
    return stream


# ------------------------------------------------------------------------------ tokenize


def sft_chat(tokenizer: PreTrainedTokenizerBase, template_kwargs: dict[str, Any] | None = None) -> ChatTokens:
    """The chat renderer of a run's conversations (made once per run: it checks the template variables and finds
    the end-of-turn tokens); UserError when the tokenizer has no chat template."""
    if tokenizer.chat_template is None:
        raise UserError("the tokenizer has no chat template; SFT needs one to find the assistant tokens")
    return ChatTokens(tokenizer, template_kwargs)


def tokenize_conversation(chat: ChatTokens, messages: Messages) -> SFTExample:
    """Token ids of the whole conversation and the mask of the assistant tokens that train (`chat`: `sft_chat`).

    Built turn by turn as a multi-turn rollout is (`chat.template_tokens`): the first prompt, then each assistant
    turn as the template renders a last turn (its reasoning and tool calls included: "as the data says"), then
    the template's text up to the next assistant turn. Earlier turns stay in the context of later ones as they
    were trained, the way token-exact multi-turn RL keeps what was sampled. A turn trains through its last
    end-of-turn token (the template's closer); `"train": false` on an assistant message keeps it as context only."""
    turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    if not any(messages[i].get("train") is not False for i in turns):
        raise UserError("an SFT conversation has no assistant message to train on")
    ids = chat.prompt_ids(messages[:turns[0]], [])
    mask = [False] * len(ids)
    for k, i in enumerate(turns):
        turn = chat.turn_ids(messages[:i + 1], [])
        # The turn ends at its template's closer: the last end-of-turn token in it (one inside the content, e.g. an
        # <|endoftext|> in code data or a character the tokenizer marks unknown, is content).
        end = next((j + 1 for j in range(len(turn) - 1, -1, -1) if turn[j] in chat.end_of_turn), len(turn))
        ids += turn[:end]
        mask += [messages[i].get("train") is not False] * end
        if k + 1 < len(turns):
            tail = chat.reply_ids(messages[:i + 1], messages[i + 1:turns[k + 1]], [], turn[end - 1] if end else None)
            ids += tail
            mask += [False] * len(tail)
    return SFTExample(ids, mask)


# ------------------------------------------------------------------------------ pack


def pack(examples: list[SFTExample], seq_len: int) -> list[Row]:
    """Greedy packing in order: an example joins the current row while it fits, else starts a new one.

    Examples longer than `seq_len` are truncated to it (their tail does not train).
    """
    rows: list[list[SFTExample]] = []
    used = seq_len  # forces a new row for the first example
    for example in examples:
        n = min(len(example.input_ids), seq_len)
        example = SFTExample(example.input_ids[:n], example.loss_mask[:n])
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(example)
        used += n
    return [make_row(row) for row in rows]


def make_row(examples: list[SFTExample]) -> Row:
    lens = [len(e.input_ids) for e in examples]
    return Row(
        input_ids=torch.tensor([t for e in examples for t in e.input_ids], dtype=torch.long),
        position_ids=torch.cat([torch.arange(n) for n in lens]),
        sample_lens=torch.tensor(lens, dtype=torch.long),
        loss_mask=torch.tensor([m for e in examples for m in e.loss_mask], dtype=torch.bool),
    )


def padding_row(pad_id: int) -> Row:
    """A one-token row that trains nothing: ranks with fewer rows run it so every rank does the same forwards."""
    return make_row([SFTExample([pad_id], [False])])


def rows_for_rank(rows: list[Row], rank: int, world_size: int, pad_id: int) -> list[Row]:
    """Rows dealt round-robin; every rank gets ceil(len / world_size), padded with empty rows."""
    per_rank = -(-len(rows) // world_size)
    mine = rows[rank::world_size]
    return mine + [padding_row(pad_id) for _ in range(per_rank - len(mine))]
