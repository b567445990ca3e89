"""ASGI middleware that vLLM's OpenAI server loads (`--middleware`): prime-rl's extra routes.

- Every request first passes `guard.RequestGuard` with the launcher's `AccessPolicy` (API key
  on every route but /health, admin-endpoint Host and Content-Type checks, body cap).
- `POST /update_weights {"path": ".../step_N"[, "step": N][, "in_flight": true]}`: the directory must lie under
  an allowed root and fit the served model (`weight_check`: architecture, tensor names,
  shapes and dtypes against the directory vLLM started from, finite values); only then
  it waits for in-flight requests (new ones are held), loads the directory on every
  worker through `collective_rpc`, resets the prefix cache, sets vLLM's weight version to `N`, answers
  `{"weight_step": N}`. With `"in_flight": true` (vLLM >= 0.32: `token_steps.in_flight_problem`) nothing waits:
  vLLM's scheduler is paused with `mode="keep"` (running requests stay), the weights load, the version becomes `N`,
  and the scheduler resumes; running requests go on under the new weights with the KV cache computed under the old
  ones (`vllm.in_flight_kv = "keep"`), or, with "recompute" (`clear_cache=True`), vLLM preempts them and prefills
  them again under the new ones. Each token's step comes from vLLM's weight-version spans (`token_steps.py`).
  With "resubmit" (any vLLM that can pause, spans or not: `abort.py`) new requests are held as in a drained update
  and the running ones are aborted (answered with their tokens so far, `finish_reason: "abort"`, all of their
  admission step) until none runs, then the weights load; the orchestrator's client sends the rest again.
  A load that fails part-way reloads the weights served before (the last directory loaded, or the served
  checkpoint), so the server stays on the old step and serving; if even that fails, /health answers 503.
  The update's files are opened once here and checked on their descriptors (`weight_dirs.py`); they stay
  open until the update is answered. The workers read the tensors again, in their own processes, by the
  files' real paths, and each worker refuses (before loading any) a file that is not the very one checked
  here (`weights.open_pinned`: same device and inode, which cannot be reused while it is held open here).
  A LoRA adapter directory is checked by `adapter_check` and loaded through vLLM's dynamic
  LoRA loading instead, from a private copy of the checked files made through their descriptors (vLLM's
  loader takes only a path), then served under the model's name (`adapters.py`). An adapter
  update with `"in_flight": true` pauses nothing: new requests get the new adapter, running ones keep theirs.
  A marker directory (`weights/step_N/transfer.json`, `weight_transfer.mode = "distributed"`): the
  workers joined the trainer's transfer group at startup (`TRANSFER_ENV`, the lifespan startup) and
  received the weights themselves (`worker.py`); the middleware polls them until each has an update
  of step >= N (vLLM goes on serving), has each set aside its newest (until all agree on one step,
  which is then the served one), then loads it on every worker inside the gate.
- `POST /reset`: resets vLLM's prefix cache.
- Generate requests are parsed strictly first (`protocol.parse_json`: no NaN/Infinity,
  lone surrogates or deep nesting reach vLLM; 400 instead).
- Non-streaming JSON answers of `/v1/completions` and `/v1/chat/completions` get a
  top-level `weight_step` (the step they were admitted under; see `gate.py`), each choice
  with `token_ids` its `token_weight_steps` (from vLLM's weight-version spans: several steps for a request that
  ran across in-flight updates; all the admission step when none happened), and completions a top-level
  `prompt_token_ids` (vLLM puts it on each choice). Every generate request is salted with the weights'
  *cache epoch* at its admission (`cache_salt`; a client's own salt is hashed in), which each update advances once
  vLLM can no longer compute under the old weights (after the pause, or the drain): a request admitted after that never
  reuses a prefix cached under older weights, also while requests that started under them still run (vLLM cannot
  reset the prefix cache then). A request admitted before it may (it belongs to the old weights, as a running
  request's kept KV cache does).
- `prompt_logprobs` (the teacher's scoring call) passes to vLLM, whose answer has the builtin
  backend's shape; vLLM computes prompt logprobs from the raw logits (its
  `--logprobs-mode processed_logprobs` covers sampled tokens only), so a request that asks for
  them at a temperature other than 0 or 1 is a 400 (`prompt_logprobs_problem`) rather than
  an answer under the wrong distribution.
- A request asking for more completion tokens than `max_request_tokens` (prompts x n x
  max_tokens, `protocol.budget_overflow`) is a 400 before vLLM sees it.
- prompt + max_tokens beyond the context is a 400, as with the builtin backend (vLLM
  itself clamps max_tokens to the room left). A max_tokens that alone fills the context
  is refused before generating; otherwise the prompt's length is known only from the
  answer's `usage.prompt_tokens`, so a request with one prompt is checked on the answer.

A pure ASGI middleware needs nothing from vLLM but `app.state.engine_client`, which
keeps it independent of the server's internal layout across vLLM versions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prime_rl.inference.adapter_check import verify_adapter_dir
from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.update import update_weights
from prime_rl.inference.vllm import token_steps
from prime_rl.inference.vllm.abort import abort_problem, pause_aborting
from prime_rl.inference.vllm.adapters import (
    LOAD_PATH,
    UNLOAD_PATH,
    LoadedAdapter,
    ServedAdapters,
    adapter_name,
    aliased,
    asks_for_served,
    call_app,
)
from prime_rl.inference.vllm.worker import (
    LOAD_DIR,
    LOAD_PINNED,
    PIN_TRANSFERRED,
    START_TRANSFER,
    TRANSFERRED_STEP,
    transfer_result,
)
from prime_rl.inference.weight_check import Reference, verify_weight_dir
from prime_rl.inference.weight_dirs import WeightDir, open_weight_dir
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.guard import RequestGuard, error_payload, read_body, replay, send_error, send_json
from prime_rl.openai_api.protocol import UpdateWeightsRequest, budget_overflow, context_overflow, integral, parse_json
from prime_rl.utils.errors import UserError, first_line
from prime_rl.utils.logging import ensure_logging, get_logger

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
TIMEOUT_ENV = "PRIME_INFERENCE_UPDATE_TIMEOUT_S"  # set by the launcher from update_timeout_s
CONTEXT_ENV = "PRIME_INFERENCE_CONTEXT_LEN"  # set by the launcher to vLLM's --max-model-len
SERVED_NAME_ENV = "PRIME_INFERENCE_SERVED_NAME"  # set by the launcher to --served-model-name (the adapter alias)
TRANSFER_ENV = "PRIME_INFERENCE_WEIGHT_TRANSFER"  # set by the launcher: the server's WeightTransferConfig (JSON)
IN_FLIGHT_KV_ENV = "PRIME_INFERENCE_IN_FLIGHT_KV"  # set by the launcher from vllm.in_flight_kv
PIN_POLL_S = 0.02  # how often a marker update asks the workers whether its weights have arrived

log = get_logger("inference")


def completion_limit(body: Any) -> tuple[int | None, bool]:
    """A parsed generate request's max_tokens (None: absent, or a body vLLM will reject itself) and
    whether it holds one prompt (chat messages, a string, or one list of token ids)."""
    if not isinstance(body, dict):
        return None, False
    limit = body.get("max_tokens")
    if limit is None:
        limit = body.get("max_completion_tokens")
    limit = _whole(limit)
    return limit, prompt_count(body) == 1


def _whole(value: Any) -> int | None:
    """`value` as an int when it is one in JSON's sense (2 or 2.0, as vLLM's lax models read it; never a boolean),
    else None."""
    value = integral(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_token_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(_whole(token) is not None for token in prompt)


def prompt_count(body: dict) -> int:
    """How many prompts a generate request holds: a batched `prompt` (a list of texts or of token-id lists)
    holds several, anything else one."""
    prompt = body.get("prompt")
    if "messages" not in body and isinstance(prompt, list) and prompt and not _is_token_ids(prompt):
        return len(prompt)
    return 1


def budget_problem(body: Any, context_len: int | None, budget: int) -> str | None:
    """Why a generate request asks for more completion tokens than `budget` (`protocol.budget_overflow`:
    prompts x n x max_tokens, max_tokens unset counting as the context), or None (also for a body vLLM
    will reject itself)."""
    if not isinstance(body, dict):
        return None
    limit, _ = completion_limit(body)
    n = _whole(body.get("n", 1))
    if limit is None:
        limit = context_len
    if limit is None or n is None or n < 1:
        return None
    return budget_overflow(prompt_count(body), n, limit, budget)


def prompt_logprobs_problem(body: Any) -> str | None:
    """Why vLLM cannot answer this generate request's `prompt_logprobs` as prime-rl defines them (the
    logprobs at the request's temperature, docs/inference.md), or None. vLLM's prompt logprobs are
    log_softmax of the raw logits: that is the definition at temperature 1, and at 0 (untempered)."""
    if not isinstance(body, dict) or body.get("prompt_logprobs") is None:
        return None
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature not in (0, 1):
        return (f"prompt_logprobs at temperature {temperature} are not available from vLLM, which computes them "
                "from the raw logits (temperature 1): use temperature 1 or the builtin backend")
    return None


def checkpoint_dir(model: str | None) -> Path | None:
    """The served model's checkpoint: its directory, or its snapshot in the Hugging Face cache; None when
    neither can be found."""
    if model is None:
        return None
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        return None


def reference_of(model: str | None) -> Reference | None:
    """The served model's checkpoint as the reference for updates; None (updates then get only the value
    checks) when it cannot be read."""
    path = checkpoint_dir(model)
    try:
        return Reference.from_dir(path) if path is not None else None
    except UserError as exc:
        log.warning(f"cannot read the served model's checkpoint ({exc}): updates are checked for values only")
        return None


class PrimeRLMiddleware:
    def __init__(self, app):
        ensure_logging("inference")  # vLLM's process: our lines go to its stderr (the server's log)
        self.app = app
        self.access = AccessPolicy.from_env(os.environ)
        self.gate = WeightGate(step=0, timeout_s=float(os.environ.get(TIMEOUT_ENV, "600")))
        self.context_len = int(os.environ[CONTEXT_ENV]) if CONTEXT_ENV in os.environ else None
        self.guarded = RequestGuard(self._route, self.access)
        self.served_name = os.environ.get(SERVED_NAME_ENV)
        self.adapters = ServedAdapters()  # the LoRA adapter requests for served_name get, and older ones in use
        self._reference: list[Reference | None] = []  # resolved on the first update
        self.transfer = os.environ.get(TRANSFER_ENV)  # the workers join the trainer's group at startup
        self.transfer_started = False
        self._updating = asyncio.Lock()
        self.updates = 0  # in-flight updates so far: a request that saw one needs vLLM's spans for its tokens' steps
        self.cache_epoch = 0  # advanced by every update once the old weights compute nothing more (`salted`)
        in_flight_kv = os.environ.get(IN_FLIGHT_KV_ENV, "keep")
        self.recompute_kv, self.resubmit = in_flight_kv == "recompute", in_flight_kv == "resubmit"
        self.restore_from: tuple[str, list] | None = None  # the last full weights loaded (path, pins): a failed
        # load reloads them (None: the served checkpoint; after weights that came over the transfer group: nothing)
        self.restorable = True
        self.broken: str | None = None  # why the served weights are unknown (a failed load that could not be undone)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" and self.transfer is not None:
            return await self.app(scope, receive, _OnStartup(send, partial(self._start_transfer, scope)))
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        return await self.guarded(scope, receive, send)

    async def _start_transfer(self, scope) -> None:
        """Every worker joins the trainer's weight transfer group (in a thread of its own: this returns at once)."""
        model_dir = await asyncio.to_thread(checkpoint_dir, self.access.model_dir)
        ranks = await self._workers(scope, START_TRANSFER, self.transfer, str(model_dir) if model_dir else None)
        self.transfer_started = True
        log.info(f"vLLM workers joining the trainer's weight transfer group as ranks {ranks}")

    @staticmethod
    async def _workers(scope, method: str, *args) -> list:
        """Every worker's value of a transfer method (`worker.reported`); RuntimeError naming a failed one."""
        return transfer_result(await scope["app"].state.engine_client.collective_rpc(method, args=args))

    async def _pin(self, scope, path: Path, step: int) -> int:
        """Wait (polling, so vLLM's engine goes on serving) until every worker has received an update of step >=
        `step`, then have each set aside its newest; when one received a newer one meanwhile they differ, so wait
        for that one everywhere and ask again. The step they agree on. At most the update timeout."""
        if not self.transfer_started:
            raise UserError(f"{path} marks weights sent over torch.distributed, but this server is in no weight "
                            "transfer group (weight_transfer.mode)")
        deadline, target = time.monotonic() + self.gate.timeout_s, step
        try:
            while True:
                newest = await self._workers(scope, TRANSFERRED_STEP)
                if min(newest) >= target:
                    pinned = await self._workers(scope, PIN_TRANSFERRED, target)
                    if len(set(pinned)) == 1:
                        return int(pinned[0])
                    target = max(pinned)
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"waited {self.gate.timeout_s:g}s; the workers have steps {newest}")
                else:
                    await asyncio.sleep(PIN_POLL_S)
        except RuntimeError as exc:
            raise UserError(f"no weights of step >= {step} came over the transfer group: {exc}") from None

    async def _route(self, scope, receive, send):
        path, method = scope["path"], scope["method"]
        if method == "POST" and path == "/update_weights":
            return await self._update(scope, receive, send)
        if method == "POST" and path == "/reset":
            await scope["app"].state.engine_client.reset_prefix_cache()
            return await send_json(send, 200, {"status": "ok"})
        if method == "POST" and path in GENERATE_PATHS:
            return await self._generate(scope, receive, send)
        if path == "/health" and self.broken is not None:
            return await send_error(send, 503, self.broken)
        return await self.app(scope, receive, send)

    async def _body(self, receive) -> tuple[bytes, Any]:
        """The (already size-checked) body and its strict parse; ValueError names what is wrong."""
        raw = await read_body(receive, self.access.max_request_bytes)
        return raw, await asyncio.to_thread(parse_json, raw)

    async def _generate(self, scope, receive, send):
        try:
            raw, body = await self._body(receive)
        except ValueError as exc:
            return await send_error(send, 400, str(exc))
        unanswerable = prompt_logprobs_problem(body) or budget_problem(body, self.context_len,
                                                                        self.access.max_request_tokens)
        if unanswerable:
            return await send_error(send, 400, unanswerable)
        max_tokens, single_prompt = completion_limit(body) if self.context_len is not None else (None, False)
        if max_tokens is not None and max_tokens >= self.context_len:
            message = f"max_tokens ({max_tokens}) leaves no room for a prompt in the context length {self.context_len}"
            return await send_error(send, 400, message)
        if self.broken is not None:
            return await send_error(send, 503, self.broken)
        app = scope.get("app")
        if app is not None:  # vLLM's app (always, in vLLM); a bare ASGI stand-in has none
            token_steps.record_outputs(app.state.engine_client)
        try:
            async with self.gate.request() as step:
                adapter = self.adapters.take() if asks_for_served(body, self.served_name) else None
                try:
                    await self._generate_admitted(scope, receive, send, raw, body, step, adapter, max_tokens,
                                                  single_prompt)
                finally:
                    if adapter is not None:
                        await self._unload(scope, self.adapters.release(adapter))
        except GateTimeout as exc:
            await send_error(send, 503, str(exc))

    async def _generate_admitted(self, scope, receive, send, raw: bytes, body: Any, step: int,
                                 adapter: LoadedAdapter | None, max_tokens: int | None, single_prompt: bool):
        """Pass an admitted generate request to vLLM (under `adapter`, whose step it is then answered under) and
        stamp its answer."""
        n = (_whole(body.get("n", 1)) or 1) if isinstance(body, dict) else 1
        step = adapter.step if adapter is not None else step
        with token_steps.collecting() as calls:
            finish = partial(self._finish, step=step, max_tokens=max_tokens if single_prompt else None,
                             spans=partial(self._spans, calls, n, self.updates))
            routed = body
            if adapter is not None:  # a LoRA adapter serves: ask vLLM for it, answer under the model's name
                routed, finish = aliased(body, adapter.name), partial(_renamed, finish, body.get("model"))
            routed = salted(routed, self.cache_epoch)
            if routed is not body:
                raw = json.dumps(routed).encode()
            await self.app(scope, replay(raw, receive), _FinishAnswer(send, finish))

    def _spans(self, calls: list, n: int, updates: int, choice: int) -> token_steps.Spans | None:
        """Choice `choice`'s weight-version spans when an in-flight update happened while the request ran (else
        None: every token has the admission step); a ValueError when vLLM gave none then (its tokens' steps are
        unknown)."""
        if self.updates == updates:
            return None
        spans = token_steps.choice_spans(calls, choice, n)
        if spans is None:
            raise ValueError("an in-flight weight update happened while this request ran, but vLLM reported no "
                             "weight-version spans for it: its tokens' weight steps are unknown")
        return spans

    def _finish(self, payload: dict, step: int, max_tokens: int | None, spans=None) -> int | None:
        """Stamp a generated answer (`spans(choice)`: a choice's weight-version spans, None: all `step`), or make
        it a 400 when its prompt left no room for max_tokens (a 500 when its tokens' steps are unknown)."""
        prompt_tokens = (payload.get("usage") or {}).get("prompt_tokens")
        if max_tokens is not None and isinstance(prompt_tokens, int):
            overflow = context_overflow(prompt_tokens, max_tokens, self.context_len)
            if overflow:
                payload.clear()
                payload.update(error_payload(400, overflow))
                return 400
        if self.broken is not None:  # it ran across an update that left the weights unknown
            payload.clear()
            payload.update(error_payload(503, self.broken))
            return 503
        payload["weight_step"] = step
        lift_prompt_token_ids(payload)
        try:
            stamp_token_weight_steps(payload, step, spans)
        except ValueError as exc:
            payload.clear()
            payload.update(error_payload(500, str(exc)))
            return 500
        return None

    async def _checked(self, weights: WeightDir) -> None:
        """Run `weight_check` (an adapter: `adapter_check`) on an update's open files (in a thread: it reads
        every tensor once)."""
        if not self._reference:
            self._reference.append(await asyncio.to_thread(reference_of, self.access.model_dir))
        if not weights.is_adapter:
            await asyncio.to_thread(verify_weight_dir, weights, self._reference[0], False)
            return
        adapter = await asyncio.to_thread(verify_adapter_dir, weights, self._reference[0], False)
        if adapter.modules_to_save:
            raise UserError(f"adapter in {weights.path} saves {adapter.modules_to_save} in full (modules_to_save), "
                            "which vLLM's LoRA adapters cannot carry: train with trainer.lora.merge = true")

    async def _load(self, scope, weights: WeightDir, step: int, keep_running: bool = False) -> None:
        """Load an update into vLLM (inside the gate) and make `step` its weight version: drained (or an adapter,
        which needs no pause: running requests keep theirs), or with `keep_running` between a
        `pause_generation(mode="keep")` and the `resume_generation` (module docstring). A load that fails reloads
        the weights served before (`_restore`) and raises."""
        engine = scope["app"].state.engine_client
        if keep_running:
            await engine.pause_generation(mode="keep", clear_cache=self.recompute_kv)
        self.cache_epoch += 1  # vLLM computes nothing now under the old weights for a request admitted later
        served_before, adapter = (self.restore_from, self.restorable), None
        try:
            adapter = await self._load_weights(scope, weights, step)
            await engine.reset_prefix_cache()
            if callable(getattr(engine, "update_weight_version", None)):  # vLLM >= 0.32 (always, in flight)
                await engine.update_weight_version(str(step))
        except BaseException:
            self.restore_from, self.restorable = served_before
            if weights.is_adapter:  # the base weights are as they were; the new adapter never served
                await self._unload(scope, adapter)
            else:
                await self._restore(engine)
            raise
        else:  # new requests get the new adapter (or, after full weights, none) once nothing of the update failed
            previous = self.adapters.serve(adapter)
        finally:
            if keep_running:
                await self._resume(engine)
        if keep_running:
            self.updates += 1
        await self._unload(scope, previous)

    async def _abort_running(self, engine) -> None:
        """End every request vLLM runs now (answered with its tokens so far, `abort.py`), then let vLLM take
        requests again: the update's gate holds new ones, and calls this until every admitted one has answered."""
        try:
            await pause_aborting(engine)
        finally:
            await self._resume(engine)  # also after a pause that failed part-way: never leave vLLM paused

    async def _resume(self, engine) -> None:
        """Resume vLLM's scheduler after an in-flight update; if it cannot, the server is broken (it would never
        answer the requests it holds)."""
        try:
            await engine.resume_generation()
        except Exception as exc:  # noqa: BLE001 - a paused engine serves nothing
            self.broken = f"vLLM did not resume after a weight update ({first_line(exc)}): restart the server"
            log.error(self.broken)
            raise

    async def _restore(self, engine) -> None:
        """Reload the full weights served before a failed load (the last directory loaded, else the served
        checkpoint); when that fails too, the server reports itself broken (/health and generate: 503)."""
        try:
            if not self.restorable:
                raise RuntimeError("the weights served before came over the transfer group and are not kept")
            if self.restore_from is None:
                with open_weight_dir(checkpoint_dir(self.access.model_dir)) as served:
                    await engine.collective_rpc(LOAD_DIR, args=(str(served.path), served.pins()))
            else:
                await engine.collective_rpc(LOAD_DIR, args=self.restore_from)
            await engine.reset_prefix_cache()
        except Exception as exc:  # noqa: BLE001 - whatever it was, the served weights are now unknown
            self.broken = f"a weight update failed part-way and the weights served before could not be reloaded " \
                          f"({first_line(exc)}): restart the server"
            log.error(self.broken)

    async def _load_weights(self, scope, weights: WeightDir, step: int) -> LoadedAdapter | None:
        """Full weights on every worker (pinned to the files checked here), or a LoRA adapter through vLLM's
        dynamic LoRA route from a private copy of its checked files (returned: `_load` serves it once the update
        succeeded, and the previous adapter is unloaded when no running request uses it, `adapters.py`)."""
        engine = scope["app"].state.engine_client
        adapter = None
        if weights.is_adapter:
            adapter = LoadedAdapter(adapter_name(step), step, await asyncio.to_thread(weights.private_copy))
            try:
                status, answer = await call_app(self.app, scope, LOAD_PATH, {"lora_name": adapter.name,
                                                                              "lora_path": str(adapter.copy)})
            except BaseException:
                shutil.rmtree(adapter.copy, ignore_errors=True)
                raise
            if status != 200:
                shutil.rmtree(adapter.copy, ignore_errors=True)
                raise RuntimeError(f"vLLM refused the adapter ({status}): {answer.decode(errors='replace')[:300]}")
        elif weights.is_marker:
            await self._workers(scope, LOAD_PINNED, step)
            self.restorable = False
        else:
            await engine.collective_rpc(LOAD_DIR, args=(str(weights.path), weights.pins()))
            self.restore_from, self.restorable = (str(weights.path), weights.pins()), True  # `_load` undoes it
        return adapter

    async def _unload(self, scope, adapter: LoadedAdapter | None) -> None:
        """Unload an adapter no request uses any more from vLLM and remove its private copy (None: nothing)."""
        if adapter is None:
            return
        status, answer = await call_app(self.app, scope, UNLOAD_PATH, {"lora_name": adapter.name})
        if status != 200:
            log.warning(f"could not unload LoRA adapter {adapter.name} ({status}): {answer[:300]!r}")
        shutil.rmtree(adapter.copy, ignore_errors=True)

    async def _update(self, scope, receive, send):
        """One update at a time (a marker's pinned update must be the one loaded); the gate then drains."""
        async with self._updating:
            return await self._update_one(scope, receive, send)

    async def _update_one(self, scope, receive, send):
        try:
            _, parsed = await self._body(receive)
            body = UpdateWeightsRequest.model_validate(parsed)
        except ValidationError as exc:
            return await send_error(send, 400, f"invalid request: {exc.errors()[0]['msg']}")
        except ValueError as exc:
            return await send_error(send, 400, str(exc))
        loader = VLLMLoader(self, scope, body.in_flight)
        status, payload = await update_weights(body, loader, self.access.weight_roots, self.gate)
        await send_json(send, status, payload)


class VLLMLoader:
    """vLLM's side of `/update_weights` (`inference/update.py`) for one request: check the directory (or pin a
    marker's transferred weights on every worker), then load it on every worker or as a LoRA adapter, drained or,
    with `in_flight`, while requests run: an adapter at once (running requests keep theirs, `adapters.py`), full
    weights during a kept pause (vLLM >= 0.32, per-token steps from its spans) or, with `vllm.in_flight_kv =
    "resubmit"`, after aborting the running requests (`abort.py`)."""

    def __init__(self, middleware: PrimeRLMiddleware, scope, in_flight: bool = False):
        self.middleware, self.scope, self.wants_in_flight = middleware, scope, in_flight
        self.in_flight = True  # which updates may is `stage`'s question: adapters always, full weights if vLLM can
        self.keep_running = False  # `apply` loads during a kept pause
        self.hurry = None  # `abort.py`: the gate drains by aborting (update.py)

    async def stage(self, weights: WeightDir, step: int) -> tuple[int, WeightDir]:
        if self.wants_in_flight and not weights.is_adapter:
            engine = self.scope["app"].state.engine_client
            if self.middleware.resubmit:
                problem = abort_problem(engine)
                self.hurry = partial(self.middleware._abort_running, engine)
            else:
                problem = token_steps.in_flight_problem(engine)
                self.keep_running = True
            if problem is not None:
                raise UserError(f"in-flight weight update refused: {problem}")
        if weights.is_marker:
            return await self.middleware._pin(self.scope, weights.path, step), weights
        await self.middleware._checked(weights)
        return step, weights

    async def apply(self, staged: WeightDir, step: int) -> None:
        await self.middleware._load(self.scope, staged, step, self.keep_running)


def stamp_token_weight_steps(payload: dict, step: int, spans=None) -> None:
    """Every choice's `token_weight_steps`: from its weight-version spans (`spans(choice index)`,
    `token_steps.token_steps`), or all `step` (the admission step) without them. ValueError: they do not fit."""
    for position, choice in enumerate(payload.get("choices") or []):
        if isinstance(choice, dict) and isinstance(choice.get("token_ids"), list):
            count = len(choice["token_ids"])
            found = spans(choice.get("index", position)) if spans is not None else None
            choice["token_weight_steps"] = ([step] * count if found is None
                                            else token_steps.token_steps(found, count, step))


def salted(body: Any, epoch: int) -> Any:
    """A generate request with `cache_salt` naming the weights' cache epoch it is admitted under (after the client's
    own salt, if any): vLLM's prefix cache then never serves it blocks computed under older weights."""
    if not isinstance(body, dict):
        return body
    own = body.get("cache_salt")
    if not isinstance(own, str) or not own:
        return {**body, "cache_salt": f"e{epoch}"}
    salt = f"{hashlib.sha256(own.encode(errors='replace')).hexdigest()}.e{epoch}"  # any salt fits vLLM's 128 chars
    return {**body, "cache_salt": salt}


def lift_prompt_token_ids(payload: dict) -> None:
    """vLLM puts a completion's `prompt_token_ids` on each choice; the contract also has it top-level."""
    if payload.get("prompt_token_ids") is None and payload["choices"]:
        lifted = payload["choices"][0].get("prompt_token_ids")
        if lifted is not None:
            payload["prompt_token_ids"] = lifted


def _renamed(finish, model: str | None, payload: dict) -> int | None:
    """`finish`, with the answer's `model` back to what the client asked for (not the adapter's name)."""
    if model is not None:
        payload["model"] = model
    return finish(payload)


class _FinishAnswer:
    """Wraps `send`: a non-streaming JSON answer with `choices` goes through `finish(payload)`,
    which edits it in place and may return a new HTTP status."""

    def __init__(self, send, finish):
        self.send, self.finish = send, finish
        self.start: dict | None = None
        self.chunks: list[bytes] = []
        self.passthrough = False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            if b"application/json" not in headers.get(b"content-type", b""):
                self.passthrough = True  # streaming (text/event-stream) goes out unchanged
                return await self.send(message)
            self.start = message
            return None
        if self.passthrough or message["type"] != "http.response.body":
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        body, status = b"".join(self.chunks), self.start["status"]
        try:
            payload = json.loads(body)
            if isinstance(payload, dict) and "choices" in payload:
                status = self.finish(payload) or status
                body = json.dumps(payload).encode()
        except json.JSONDecodeError:
            pass
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**self.start, "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


class _OnStartup:
    """Wraps a lifespan's `send`: once the app has started, `started()` runs before the startup is reported;
    if it fails, the startup fails with its one-line reason (vLLM then exits)."""

    def __init__(self, send, started):
        self.send, self.started = send, started

    async def __call__(self, message):
        if message["type"] == "lifespan.startup.complete":
            try:
                await self.started()
            except Exception as exc:
                reason = f"weight transfer: {first_line(exc)}"
                log.error(reason)
                return await self.send({"type": "lifespan.startup.failed", "message": reason})
        return await self.send(message)
