"""`reasoning-gym`: procedural reasoning tasks with algorithmic verifiers from the reasoning-gym library
(`pip install prime-rl[reasoning-gym]`; fully offline).

    [[orchestrator.env]]
    id = "reasoning-gym"
    args = { tasks = { leg_counting = 1.0, basic_arithmetic = 2.0 }, size = 10000 }

- `tasks`: one task name, a list of names (equal weights), or a table name -> weight; `task_config`: per-task
  keyword arguments of `reasoning_gym.create_dataset` (e.g. `{ basic_arithmetic = { max_digits = 3 } }`).
- Examples: each draw picks a task with probability weight / sum (a seeded RNG) and takes that task's next
  entry of a data set of `size` entries made from the draw's seed and epoch (`create_dataset(name, size=,
  seed=)`), so the n-th example of a seed never changes (resume continues where it stopped). Evaluation
  draws from other seeds than training (`eval_examples`).
- Prompt: the entry's `question` as the user message, after `system_prompt` (by default it asks for the
  final answer inside `<answer>` tags).
- Reward: the task's own `score_answer(answer, entry)` of the extracted answer (`extract`, as in the
  `dataset` environment: "auto" takes the last `<answer>` block, else a `\\boxed{}`, else the whole text;
  "last_line" the last line; "last_number" the last number); logged per task as `reward/<env>/<task>`. With
  `pass_score` the reward is 1 where that score reaches it and 0 below (many tasks give partial credit, e.g. per
  letter or for a near number, which a policy can farm instead of answering right); the task's own score stays
  logged as `reward/<env>/<task>/score`.
"""

from __future__ import annotations

import difflib
import random
import zlib
from collections.abc import Iterator
from typing import Any

from prime_rl.envs.environment import Environment, Example, Reward, chat_prompt, require
from prime_rl.envs.registry import register_env
from prime_rl.envs.reward_functions import EXTRACTIONS, extract_answer
from prime_rl.utils.errors import UserError

ANSWER_PROMPT = ("Think it through, then give only your final answer inside <answer> and </answer> tags, "
                 "e.g. <answer>42</answer>.")
EVAL_SALT = 7_919  # eval seeds differ from every training seed of the same run


def _reasoning_gym():
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise UserError("environment 'reasoning-gym' needs the reasoning-gym package: pip install "
                        "prime-rl[reasoning-gym]") from None
    return reasoning_gym, DATASETS


@register_env
class ReasoningGymEnv(Environment):
    id = "reasoning-gym"

    def __init__(self, tasks: Any = None, size: int = 10_000, task_config: dict | None = None,
                 system_prompt: str = ANSWER_PROMPT, extract: str = "auto", pass_score: float | None = None):
        library, known = _reasoning_gym()
        if isinstance(tasks, str):
            tasks = {tasks: 1.0}
        elif isinstance(tasks, list):
            tasks = dict.fromkeys(tasks, 1.0)
        require(isinstance(tasks, dict) and tasks, self.id, "tasks must be a task name, a list of names or a table "
                                                            "name -> weight, e.g. tasks = 'leg_counting'")
        for name, weight in tasks.items():
            if name not in known:
                close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
                hint = (f"close names: {', '.join(close)}" if close
                        else f"{len(known)} tasks, e.g. {', '.join(sorted(known)[:5])}")
                raise UserError(f"environment '{self.id}': unknown task {name!r} ({hint})")
            require(isinstance(weight, int | float) and not isinstance(weight, bool) and weight > 0, self.id,
                    f"the weight of task {name!r} must be a positive number, got {weight!r}")
        require(size >= 1, self.id, f"size must be >= 1, got {size}")
        require(extract in EXTRACTIONS, self.id, f"extract must be one of {', '.join(EXTRACTIONS)}, not {extract!r}")
        require(pass_score is None or (isinstance(pass_score, int | float) and not isinstance(pass_score, bool)
                                       and 0 < pass_score <= 1), self.id,
                f"pass_score must be a number in (0, 1] (1: exact answers only), got {pass_score!r}")
        self.pass_score = pass_score
        self.library, self.tasks, self.size = library, dict(tasks), size
        self.task_config = task_config or {}
        unknown = sorted(set(self.task_config) - set(self.tasks))
        require(not unknown, self.id, f"task_config names task(s) not in tasks: {', '.join(unknown)}")
        self.system_prompt, self.extract = system_prompt, extract
        self._datasets: dict[tuple[str, int], Any] = {}
        self._dataset(next(iter(self.tasks)), 0)  # a bad task_config fails now, at config time

    def _dataset(self, task: str, seed: int):
        key = (task, seed)
        if key not in self._datasets:
            try:
                self._datasets[key] = self.library.create_dataset(task, size=self.size, seed=seed,
                                                                  **self.task_config.get(task, {}))
            except (TypeError, ValueError, AssertionError) as exc:
                raise UserError(f"environment '{self.id}': task {task!r} rejects its config: {exc}") from None
        return self._datasets[key]

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        names, weights = list(self.tasks), list(self.tasks.values())
        drawn = dict.fromkeys(names, 0)
        while True:
            task = rng.choices(names, weights)[0] if len(names) > 1 else names[0]
            epoch, index = divmod(drawn[task], self.size)
            drawn[task] += 1
            data_seed = zlib.crc32(f"{seed}:{task}:{epoch}".encode())
            entry = self._dataset(task, data_seed)[index]
            yield Example(chat_prompt(self.system_prompt, entry["question"]), str(entry["answer"]),
                          {"task": task, "entry": entry, "data_seed": data_seed})

    def examples(self, seed: int = 0) -> Iterator[Example]:
        return self._stream(seed)

    def eval_examples(self, seed: int = 0) -> Iterator[Example]:
        return self._stream(seed * EVAL_SALT + 1)

    async def score(self, example: Example, completion: str) -> Reward:
        task, entry = example.info["task"], example.info["entry"]
        dataset = self._dataset(task, example.info["data_seed"])
        score = float(dataset.score_answer(extract_answer(completion, self.extract), entry))
        if self.pass_score is None:
            return Reward(score, {task: score})
        passed = float(score >= self.pass_score)
        return Reward(passed, {task: passed, f"{task}/score": score})
