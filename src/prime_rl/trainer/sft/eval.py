"""Greedy evaluation during SFT: answer held-out environment prompts, score with the environment.

The metric `eval/reward` is the mean `Reward.total` of greedy completions (argmax at every
step, at most `max_new_tokens`, stopping at eos) on `num_examples` examples drawn with a
seed far from the training stream's, so they are (almost surely) not trained on. Each
completion is scored as a one-turn rollout (`score_rollout`): for a multi-turn environment
that is the reward of the first turn alone, the environment never answers here.
Every rank runs the same generation (FSDP2 needs all ranks in every forward).
"""

from __future__ import annotations

import asyncio
from itertools import islice

import torch
import torch.nn as nn
from transformers import PreTrainedTokenizerBase

from prime_rl.chat.template_tokens import render_chat
from prime_rl.models.vocabulary import tokenizer_vocab
from prime_rl.trainer.sft.config import SFTDataConfig, SFTEvalConfig

EVAL_SEED_OFFSET = 1_000_003


@torch.no_grad()
def greedy_generate(model: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
                    max_new_tokens: int) -> list[list[int]]:
    """Greedy completions (token ids, eos included when produced) of left-padded prompts, without a KV cache: the
    argmax over the tokenizer's ids (`models.vocabulary`), from the logits of the last position only."""
    device = next(model.parameters()).device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    out: list[list[int]] = [[] for _ in prompts]
    vocab = tokenizer_vocab(tokenizer)
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                       logits_to_keep=1).logits[:, -1]
        nxt = logits[:, :vocab].argmax(-1)
        for i in (~done).nonzero().flatten().tolist():
            out[i].append(int(nxt[i]))
        done |= nxt == eos
        if bool(done.all()):
            break
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return out


def evaluate(model: nn.Module, tokenizer: PreTrainedTokenizerBase, data: SFTDataConfig, config: SFTEvalConfig,
             seed: int) -> dict[str, float]:
    """`eval/reward` (mean environment reward of greedy answers) and `eval/completion_len`."""
    from prime_rl.envs import load_env
    from prime_rl.envs.environment import Rollout

    env = load_env(data.env, **data.env_args)
    examples = list(islice(env.examples(seed + EVAL_SEED_OFFSET), config.num_examples))
    prompts = [tokenizer(render_chat(tokenizer, ex.prompt, template_kwargs=data.chat_template_kwargs),
                         add_special_tokens=False)["input_ids"] for ex in examples]
    was_training = model.training
    model.eval()
    completions = greedy_generate(model, tokenizer, prompts, config.max_new_tokens)
    model.train(was_training)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]

    async def score_all():
        return await asyncio.gather(*(env.score_rollout(ex, Rollout([{"role": "assistant", "content": text}]))
                                      for ex, text in zip(examples, texts, strict=True)))

    rewards = [r.total for r in asyncio.run(score_all())]
    return {
        "eval/reward": sum(rewards) / len(rewards),
        "eval/completion_len": sum(len(c) for c in completions) / len(completions),
    }
