"""The `dataset` environment: rows become examples (text or chat prompts), every row is checked at config time
with one line naming the file, row and column, epochs are shuffled deterministically, a resume continues at the
example an uninterrupted run draws (across epochs), evaluation draws held-out rows, and SFT reads the same file."""

from __future__ import annotations

import asyncio
import itertools
import json
import random

import pytest

from prime_rl.envs import load_env
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.examples.draws import ExampleSource
from prime_rl.utils.errors import UserError
from tests.support.entrypoints import run_entrypoint


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rows(n, **extra):
    return [{"question": f"q{i}", "answer": f"a{i}", **extra} for i in range(n)]


def test_rows_become_examples_with_text_or_chat_prompts_and_the_row_as_info(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "answer": "4", "level": 1},
                                              {"prompt": chat, "answer": "hello", "level": 2}])
    env = load_env("dataset", path=path, system_prompt="Answer.", shuffle=False)
    first, second = itertools.islice(env.examples(), 2)
    assert first.prompt == [{"role": "system", "content": "Answer."}, {"role": "user", "content": "2+2?"}]
    assert second.prompt == chat  # a prompt with its own system message keeps it
    assert (first.answer, first.info["level"]) == ("4", 1)


@pytest.mark.parametrize(("bad", "message"), [
    ({"question": "q", "answer": 3}, "d.jsonl:1732: column 'answer' is a int, not a string"),
    ({"question": "q"}, "d.jsonl:1732: no column 'answer'"),
    ({"question": ["not", "messages"], "answer": "a"}, "d.jsonl:1732: column 'question' must be a string or"),
])
def test_a_bad_row_far_into_the_file_is_one_line_naming_it(tmp_path, bad, message):
    data = rows(1731) + [bad] + rows(10)
    path = write_jsonl(tmp_path / "d.jsonl", data)
    with pytest.raises(UserError, match=message) as info:
        load_env("dataset", path=path)
    assert "\n" not in str(info.value)


def test_no_prompt_column_and_bad_arguments_are_one_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "x", "answer": "y"}])
    with pytest.raises(UserError, match="no prompt column .*set prompt_column"):
        load_env("dataset", path=path)
    assert load_env("dataset", path=path, prompt_column="text").train[0].prompt[-1]["content"] == "x"
    for args, message in [({}, "needs args.path"), ({"path": path, "prompt_column": "text", "rewards": {"exactish": 1}},
                          "unknown reward 'exactish'"), ({"path": path, "prompt_column": "text", "extract": "xml"},
                          "extract must be one of")]:
        with pytest.raises(UserError, match=message):
            load_env("dataset", **args)


def test_a_bad_data_file_stops_rl_before_any_process_starts_with_exit_2(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(5) + [{"question": "q", "answer": 7}])
    config = tmp_path / "rl.toml"
    config.write_text(f'[[orchestrator.env]]\nid = "dataset"\nargs = {{ path = "{path}" }}\n')
    done = run_entrypoint("rl", "@", str(config), "--output-dir", str(tmp_path / "run"), "--dry-run")
    assert done.returncode == 2
    assert "d.jsonl:6: column 'answer' is a int, not a string" in done.stderr
    assert not (tmp_path / "run").exists()


def test_epochs_are_shuffled_by_the_seed_and_each_visits_every_row_once(tmp_path):
    env = load_env("dataset", path=write_jsonl(tmp_path / "d.jsonl", rows(50)))
    first = [e.answer for e in itertools.islice(env.examples(seed=3), 150)]
    again = [e.answer for e in itertools.islice(env.examples(seed=3), 150)]
    other = [e.answer for e in itertools.islice(env.examples(seed=4), 50)]
    assert first == again and first[:50] != other
    epochs = [first[i:i + 50] for i in (0, 50, 100)]
    assert all(sorted(epoch) == sorted(r["answer"] for r in rows(50)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    in_order = load_env("dataset", path=write_jsonl(tmp_path / "e.jsonl", rows(5)), shuffle=False)
    assert [e.answer for e in itertools.islice(in_order.examples(seed=9), 10)] == [f"a{i % 5}" for i in range(10)]


def test_a_resume_draws_what_an_uninterrupted_run_draws_across_an_epoch_boundary(tmp_path):
    """The orchestrator's source of two environments (one a 7-row data set), checkpointed after 9 draws: the
    data set is into its second epoch; the resumed source continues exactly."""
    configs = [EnvConfig(id="dataset", args={"path": write_jsonl(tmp_path / "d.jsonl", rows(7))}),
               EnvConfig(id="reverse-text", weight=1.0)]
    straight = ExampleSource(configs, seed=11)
    expected = [(d.env, d.example.answer) for d in straight.draw(30)]
    first = ExampleSource(configs, seed=11)
    head = [(d.env, d.example.answer) for d in first.draw(9)]
    cursors, rng_state = dict(first.cursors), first.rng.getstate()
    assert cursors["dataset"] > 7 or cursors["dataset"] < 7  # the data set's cursor is not at an epoch edge
    rng = random.Random()
    rng.setstate(rng_state)
    resumed = ExampleSource(configs, seed=11, cursors=cursors, rng=rng)
    assert head + [(d.env, d.example.answer) for d in resumed.draw(21)] == expected
    assert sum(env == "dataset" for env, _ in expected) > 7  # the run crossed an epoch of the data set


def test_the_rows_are_the_example_pool_with_the_row_index_as_id(tmp_path):
    """The curriculum's ids: `example_pool()[i]` is row i of the training split in file order, whatever the
    shuffle, the same objects the stream yields and on every call; an agent over the data set has the same pool."""
    path = write_jsonl(tmp_path / "d.jsonl", rows(6))
    env = load_env("dataset", path=path, shuffle=True)
    pool = env.example_pool()
    assert [e.answer for e in pool] == [f"a{i}" for i in range(6)] and env.example_pool() is pool
    assert all(any(e is p for p in pool) for e in itertools.islice(env.examples(seed=3), 12))
    agent = load_env("agent", task={"id": "dataset", "args": {"path": path}}, command=["true"])
    assert [e.answer for e in agent.example_pool()] == [f"a{i}" for i in range(6)]


def test_evaluation_draws_held_out_rows(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", rows(20))
    held_out = write_jsonl(tmp_path / "test.jsonl", [{"question": "t", "answer": f"held{i}"} for i in range(4)])
    env = load_env("dataset", path=train, eval_path=held_out)
    assert {e.answer for e in itertools.islice(env.eval_examples(seed=5), 8)} == {f"held{i}" for i in range(4)}
    assert all(e.answer.startswith("a") for e in itertools.islice(env.examples(seed=5), 40))
    by_split = load_env("dataset", path=str(tmp_path), split="train", eval_split="test")
    assert {e.answer for e in itertools.islice(by_split.eval_examples(), 4)} == {f"held{i}" for i in range(4)}


def test_the_reward_is_the_weighted_sum_of_named_functions_each_logged(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "half?", "answer": "0.5"}])
    env = load_env("dataset", path=path, rewards={"numeric_match": 1.0, "format_boxed": 0.25, "exact_match": 2.0})
    example = next(env.examples())
    reward = asyncio.run(env.score(example, "It is \\boxed{1/2}."))
    assert reward.components == {"numeric_match": 1.0, "format_boxed": 1.0, "exact_match": 0.0}
    assert reward.total == pytest.approx(1.25)


def test_sft_reads_the_same_data_file(tmp_path):
    from prime_rl.trainer.sft.data import read_conversations

    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "answer": "4"}])
    assert read_conversations(path) == [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]]
