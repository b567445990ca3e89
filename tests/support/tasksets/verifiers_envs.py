"""A verifiers 0.4 tool taskset for the tests, loaded by its verifiers id `verifiers_envs` (verifiers imports the
taskset package by that name; the tests put `tests/support/tasksets/` on sys.path and the `rl` processes'
PYTHONPATH). Importable only with the extra.

The verifiers 0.4 counterpart of a 0.2 `ToolEnv`: a `Toolset` with one plain `@vf.tool` method, a task whose
`toolsets` offers it, and a `@vf.reward` and `@vf.metric` on the finished trace. The prompts are reversed tool-call
blocks (the embedded reverse-text model was measured never to complete one into a call: its rollouts are one turn)."""

from __future__ import annotations

import verifiers.v1 as vf

from prime_rl.chat.tool_calls import format_tool_call

WORDS = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]


class EchoData(vf.TaskData):
    answer: str = ""


class Letters(vf.Toolset):
    TOOL_PREFIX = None  # offered bare, as `echo`

    @vf.tool
    def echo(self, text: str) -> str:
        """Echo the text back.

        Args:
            text: what to echo
        """
        return text


class EchoTask(vf.Task[EchoData]):
    @classmethod
    def toolsets(cls, config):
        return [Letters(vf.ToolsetConfig())]

    @vf.reward
    async def letters(self, task, trace) -> float:
        """The share of the answer's letters in the last reply."""
        reply = trace.last_reply
        return sum(c in reply for c in task.answer) / len(task.answer)

    @vf.metric
    async def calls(self, trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for word in WORDS:
            prompt = format_tool_call("echo", {"text": word})[::-1]
            yield EchoTask(EchoData(prompt=prompt, answer=word), self.config.task)


__all__ = ["EchoTaskset"]
