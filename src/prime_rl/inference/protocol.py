"""OpenAI-style request bodies the builtin server accepts (a subset of vLLM's, same names).

Fields a client may send that do not change the result (`stream: false`, `user`,
`logprobs`, `return_token_ids`: token ids and logprobs are always returned) are accepted
and ignored; fields the builtin backend cannot honour are rejected with a 400.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=1024)] = 1
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: int = -1
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: Any = None
    stream: bool = False
    top_logprobs: int | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.stream:
            raise ValueError("stream=true is not supported by the builtin backend")
        if self.top_logprobs:
            raise ValueError("top_logprobs is not supported by the builtin backend (the sampled token's logprob is)")
        if isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool) and self.logprobs > 1:
            raise ValueError("logprobs > 1 (top alternatives) is not supported by the builtin backend")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_limit(self):
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(SamplingFields):
    prompt: str | list[int] = Field(min_length=1)
    echo: bool = False

    @model_validator(mode="after")
    def _no_echo(self):
        if self.echo:
            raise ValueError("echo is not supported by the builtin backend")
        return self


def context_overflow(prompt_tokens: int, max_tokens: int, context_len: int) -> str | None:
    """Why a request cannot be served when prompt + max_tokens exceeds the context, else None.

    Both backends answer such a request with a 400 rather than shortening the completion
    (vLLM on its own would clamp max_tokens to the room left).
    """
    if prompt_tokens + max_tokens <= context_len:
        return None
    return f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the context length {context_len}"


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    step: Annotated[int, Field(ge=0)] | None = None
