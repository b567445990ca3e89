"""RL and SFT at real model shapes: tiny random Qwen3 and Llama 3 models with the real tokenizers (151,669 and
128,256 ids), chat templates and, for Qwen3, 267 padded output rows. Runs are on-policy (mismatch KL < 1e-6:
every trained token sits where it was sampled and the trainer scores the distribution the server sampled)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support import REPO
from tests.support.entrypoints import run_entrypoint
from tests.support.real_tokenizers import save_tiny_model
from tests.support.rl_in_process import on_policy_run

pytestmark = pytest.mark.slow

SINGLE_TURN = '[[orchestrator.env]]\nid = "reverse-text"\n'
USER_REPLIES = '[[orchestrator.env]]\nid = "reverse-text-hint"\n'
TOOL_REPLIES = '[[orchestrator.env]]\nid = "tests.support.multi_turn_envs:ToolChat"\n'


EOS = {"qwen3": (151_645, 151_643), "llama3": (128_009, 128_001)}  # each model's two end-of-turn ids


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def talkative_model(request, tmp_path_factory):
    """A tiny random model of the real architecture that ends about half its turns within a few tokens (a random
    model of a 150k vocabulary would almost never sample its eos, and multi-turn needs turns that end): the final
    norm keeps one hidden dimension d, and the two eos rows of the output embedding are +-12 e_d."""
    name = request.param
    path = save_tiny_model(name, tmp_path_factory.mktemp(f"talkative_{name}"), seed=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        head = model.get_output_embeddings().weight
        head[list(EOS[name])] = 0.0
        head[EOS[name][0], 0], head[EOS[name][1], 0] = 12.0, -12.0
    model.save_pretrained(path)
    return path


def test_rl_runs_on_policy_with_real_tokenizers_and_templates(tmp_path, talkative_model):
    """One run mixing a single-turn environment, one that replies as the user and one that replies with tool
    messages (4 prompts a step, drawn by a seeded RNG: each is drawn within the 3 steps)."""
    run = on_policy_run(tmp_path, SINGLE_TURN + USER_REPLIES + TOOL_REPLIES, seq_len=256, max_tokens=12,
                        model=str(talkative_model), max_steps=3)
    orchestrator = run.rows("orchestrator")
    assert all(row["rollout/env_error_frac"] == 0 for row in orchestrator.values())
    drawn = {key.split("/")[1] for row in orchestrator.values() for key in row if key.endswith("/mean")
             and key.startswith("reward/")}
    assert {"reverse-text", "reverse-text-hint", "tool-chat"} <= drawn
    assert any(row["rollout/turns_mean"] > 1 for row in orchestrator.values())
    assert sum(row["rollout/tool_calls_mean"] for row in orchestrator.values()) > 0


def test_the_decoupled_correction_recomputes_the_sampler_at_a_real_vocabulary(tmp_path, talkative_model):
    """[loss.correction] old_logprobs = "trainer" over 2 epochs: the trainer's pi_old forward scores the sampled
    vocabulary as the server sampled it (Qwen3's 267 padded rows left out), so on policy lo = lq."""
    correction = ('[loss]\ntype = "dapo"\n[loss.correction]\npreset = "decoupled_token_is"\n'
                  "[trainer]\nupdate_epochs = 2\n")
    run = on_policy_run(tmp_path, SINGLE_TURN + correction, seq_len=256, max_tokens=12, model=str(talkative_model),
                        max_steps=2, exact=False)
    for step, row in run.rows("trainer").items():
        assert abs(row["correction/kl"]) < 1e-6 and row["correction/k3_kl"] < 1e-9, step
        assert abs(row["correction/is_weight"] - 1) < 1e-6, step


async def four_call_agent(client, example):
    """An agent that owns its loop: four calls, each replaying the replies it got, with a user turn between."""
    messages = [dict(m) for m in example.prompt]
    for turn in range(4):
        reply = (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": f"And then {turn}?"}]


def test_an_agent_that_owns_its_loop_trains_on_policy_with_real_tokenizers_and_templates(tmp_path,
                                                                                       talkative_model):
    """Four calls of a plain `openai` agent through its session (Qwen3's template with thinking on, Llama 3's):
    one segment each rollout, and the trainer's logprobs equal the server's (mismatch KL < 1e-6)."""
    env = ('[[orchestrator.env]]\nid = "agent"\nargs = { function = "tests.test_real_models:four_call_agent", '
           'task = { id = "reverse-text" } }\n')
    run = on_policy_run(tmp_path, env, seq_len=512, max_tokens=12, model=str(talkative_model), max_steps=2)
    for step, row in run.rows("orchestrator").items():
        assert row["rollout/env_error_frac"] == 0 and row["rollout/turns_mean"] == 4, (step, row)
        assert row["rollout/segments_mean"] == 1 and row["rollout/sampled_token_frac"] < 1, (step, row)


@pytest.fixture(scope="module")
def padded_rows_dominate(tmp_path_factory):
    """A tiny Qwen3 whose 267 padded output rows hold nearly all the probability of every position when sampled
    over all 151,936 rows: real rows' logits are 0, padded rows' are +-100 h_d (half each sign), and the final
    norm keeps one dimension d of the hidden state. Over the tokenizer's ids it is uniform."""
    path = save_tiny_model("qwen3", tmp_path_factory.mktemp("padded_qwen3"), seed=1, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_pretrained(path)
    real, rows = 151_669, model.config.vocab_size
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.zero_()
        half = real + (rows - real) // 2
        head[real:half, 0], head[half:, 0] = 100.0, -100.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
    model.save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], tokenize=False,
                                         add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        padded_mass = model(ids).logits[0, -1].softmax(-1)[real:].sum()
    assert padded_mass > 0.99  # a sampler over every row would draw a padded id at almost every token
    return path


def test_a_model_whose_padded_rows_dominate_never_samples_them_and_trains_on_policy(tmp_path, padded_rows_dominate):
    run = on_policy_run(tmp_path, USER_REPLIES, seq_len=256, max_tokens=8, model=str(padded_rows_dominate),
                        max_steps=2)
    assert all(row["rollout/env_error_frac"] == 0 for row in run.rows("orchestrator").values())


@pytest.mark.parametrize(("name", "architecture", "rows"), [("qwen3", "Qwen3ForCausalLM", 151_936),
                                                             ("llama3", "LlamaForCausalLM", 128_256)])
def test_the_sft_example_trains_the_model_given_on_the_command_line(request, tmp_path, name, architecture, rows):
    out = tmp_path / "sft"
    done = run_entrypoint("sft", "@", str(REPO / "examples/reverse_text/sft.toml"), "--model.name",
                          str(request.getfixturevalue(f"{name}_tiny_model")), "--output-dir", str(out), "--max-steps",
                          "2", "--batch-size", "4", "--weights-interval", "2", "--eval.interval", "2",
                          "--eval.num-examples", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ignoring [init]" in done.stderr
    trained = AutoModelForCausalLM.from_pretrained(out / "weights" / "step_2")
    assert trained.config.vocab_size == rows and type(trained).__name__ == architecture
