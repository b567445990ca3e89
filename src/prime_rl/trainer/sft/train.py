"""`sft` entrypoint: supervised fine-tuning with the trainer's model, optimizer, checkpoint
and weight-writing code (`TrainSession`).

    sft @ examples/reverse_text/sft.toml [--key value ...]
    torchrun --nproc-per-node K -m prime_rl.trainer.sft.train @ sft.toml

Step n takes the next `batch_size` conversations of the (deterministic) data stream,
packs them into rows of at most `seq_len` tokens, deals the rows over ranks, and
minimises the token-mean negative log-likelihood of the assistant tokens of the step:

    loss = -sum_{t in assistant tokens of the step} log p(x_t | x_<t) / (# assistant tokens of the step)

(the denominator is all-reduced over ranks, so K ranks compute the same loss as one).
"""

from __future__ import annotations

import time
from itertools import islice
from pathlib import Path

from prime_rl.configs.cli import run_main
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.run_dir import metrics_file, metrics_plot
from prime_rl.run_report import SFT_PLOTTED, MetricsTail, sft_summary_lines, write_plot
from prime_rl.trainer.dist import all_reduce_sum, destroy
from prime_rl.trainer.model import compute_rows_logprobs
from prime_rl.trainer.session import TrainSession
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.trainer.sft.data import (
    Row,
    conversation_stream,
    pack,
    rows_for_rank,
    sft_chat,
    skip,
    tokenize_conversation,
)
from prime_rl.trainer.sft.eval import evaluate


def sft_step(session: TrainSession, rows: list[Row], micro_batch_rows: int, pad_id: int) -> tuple[float, int]:
    """Forward/backward this rank's rows, `micro_batch_rows` per forward; returns the step's global loss
    and trained-token count. Every rank runs the same number of forwards (`rows_for_rank` pads)."""
    (total_tokens,) = all_reduce_sum([sum(r.num_loss_tokens for r in rows)], session.dist.device)
    denominator = max(total_tokens, 1.0)
    loss_sum = 0.0
    for first in range(0, len(rows), micro_batch_rows):
        chunk = rows[first:first + micro_batch_rows]
        results = compute_rows_logprobs(session.model, [(r.input_ids, r.position_ids, r.sample_lens) for r in chunk],
                                        SamplingRule(vocab=session.sampled_vocab), pad_id=pad_id, entropies=False)
        loss = sum(-(lp * r.loss_mask.to(lp.device)).sum() for (lp, _), r in zip(results, chunk, strict=True))
        loss = loss / denominator
        session.backward(loss)
        loss_sum += float(loss.detach())
    (loss_sum,) = all_reduce_sum([loss_sum], session.dist.device)
    return loss_sum, int(total_tokens)


def due(step: int, interval: int | None, last: int) -> bool:
    return step == last or (interval is not None and step % interval == 0)


def train(config: SFTConfig) -> None:
    started = time.monotonic()
    session = TrainSession(config, "sft", init=config.init, dropout=True)
    tokenizer, info = session.tokenizer, session.dist
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stream = skip(conversation_stream(config.data, config.seed), session.start_step * config.batch_size)
    chat = sft_chat(tokenizer, config.data.chat_template_kwargs)
    try:
        for step in range(session.start_step, config.max_steps):
            start = time.perf_counter()
            samples = [tokenize_conversation(chat, m) for m in islice(stream, config.batch_size)]
            rows = pack(samples, config.seq_len)
            mine = rows_for_rank(rows, info.rank, info.world_size, pad_id)
            lr = session.lr
            loss, trained_tokens = sft_step(session, mine, config.micro_batch_rows, pad_id)
            grad_norm = session.optimizer_step(step, loss)
            session.scheduler.step()
            step_time = time.perf_counter() - start
            metrics = {"loss/sft": loss, "optim/lr": lr, "optim/grad_norm": grad_norm,
                       "perf/trained_tokens": trained_tokens}
            tokens = sum(int(r.sample_lens.sum()) for r in mine)
            avg_len = sum(len(s.input_ids) for s in samples) / len(samples)
            metrics.update(session.perf_metrics(tokens, step_time, avg_len))
            done = step + 1
            if config.eval.interval is not None and due(done, config.eval.interval, config.max_steps):
                metrics.update(evaluate(session.model, tokenizer, config.data, config.eval, config.seed))
            session.log_metrics(metrics, step)
            session.after_step(done, write=due(done, config.weights_interval, config.max_steps))
        if info.is_main:
            report(config.output_dir, time.monotonic() - started)
    finally:
        session.close()
        destroy()


def report(output_dir: Path, wall_s: float) -> None:
    """The end of a finished run, as `rl` ends: metrics.png and the summary lines."""
    tail = MetricsTail(metrics_file(output_dir))
    tail.poll()
    plot = write_plot(tail, metrics_plot(output_dir), SFT_PLOTTED)
    for line in sft_summary_lines(tail, wall_s, output_dir):
        print(line)
    if plot is not None:
        print(f"plot: {plot}")


def main(argv: list[str] | None = None) -> None:
    run_main(SFTConfig, train, argv)


if __name__ == "__main__":
    main()
