"""The rollout viewer in a real browser: Debian's headless Chromium driven by Playwright (`tests/support/browser.py`).
The pages of real runs (reverse-text, and a multi-turn run of an agent calling a tool) are browsed as a reader
would: a step from the reward curve, a group side by side, filters, every token colouring, a screenshot; hostile
text renders as text; a run of 400 steps x 64 samples opens in under 2 seconds from a small page and a file per
step."""

from __future__ import annotations

import json
import re
import time

import pytest

from prime_rl.run_dir import (
    rollout_dir,
    samples_file,
    token_outcomes_file,
    viewer_page,
    viewer_step_file,
    viewer_step_files,
)
from prime_rl.viewer.collect import collect
from prime_rl.viewer.page import render_page
from prime_rl.viewer.view import main as prime_rl
from prime_rl.viewer.view import write_view
from tests.support.browser import chromium_page, open_page
from tests.support.rl_in_process import on_policy_run
from tests.support.sample_runs import rollout_line, samples_run

REAL_RUNS = {
    "reverse-text": dict(env_table='[[orchestrator.env]]\nid = "reverse-text"\n', seq_len=128, max_tokens=16),
    "agent-with-a-tool": dict(env_table='[[orchestrator.env]]\nid = "agent"\nargs = { function = '
                              '"examples/agent/openai_loop.py:run", task = { id = "calculator" } }\n',
                              seq_len=512, max_tokens=96, model="tiny-calculator"),
}


def write_page(root, decode=None):
    path = viewer_page(root)
    path.write_text(render_page(root, collect(root, decode=decode)))
    return path


def ids_as_letters(ids):
    return {i: chr(97 + i % 26) for i in ids}


def shown(page, selector: str) -> list:
    return [e for e in page.query_selector_all(selector) if e.is_visible()]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_RUNS))
def test_a_real_runs_page_browses_steps_groups_filters_and_colourings(tmp_path, name):
    run = on_policy_run(tmp_path, max_steps=2, **REAL_RUNS[name])
    prime_rl(["view", str(run.run_dir)])
    rows = [json.loads(line) for line in samples_file(rollout_dir(run.run_dir, 1)).read_text().splitlines()]
    group = [r for r in rows if r["group"] == 2]
    with chromium_page() as (page, errors):
        open_page(page, viewer_page(run.run_dir).as_uri())
        assert page.text_content("#summary").startswith("step 0: 16 rollouts in 4 groups")
        page.click("#curve rect[data-step='1']")  # the reward curve links to its steps
        assert page.text_content("#summary").startswith("step 1: 16 rollouts") and "step=1" in page.url
        page.click(".group-card[data-group='2']")
        assert page.text_content("#detail h2") == f"group 2 · {group[0]['env']} · 4 of 4 rollouts shown"
        boxes = [r.bounding_box() for r in shown(page, "#detail .rollout")]
        assert len(boxes) == 4 and len({b["y"] for b in boxes}) == 1  # side by side
        assert [b["x"] for b in boxes] == sorted(b["x"] for b in boxes)
        if name == "agent-with-a-tool" and any(m["role"] == "tool" for r in group for m in r["messages"]):
            assert shown(page, "#detail .message.tool")
        page.fill("#rmin", "0.5")
        page.press("#rmin", "Enter")
        passing = sum(r["reward"] >= 0.5 for r in group)
        if passing:
            assert page.text_content("#detail h2").endswith(f"{passing} of 4 rollouts shown")
            assert len(shown(page, "#detail .rollout")) == passing
        page.reload()  # the address keeps the view: filters included
        page.wait_for_selector("html[data-ready='1']")
        assert page.input_value("#rmin") == "0.5" and "rmin=0.5" in page.url
        page.fill("#rmin", "")
        page.press("#rmin", "Enter")
        page.check("#errors")  # on-policy runs of these tasks fail no rollout
        assert page.text_content("#groups") == "no rollout of this step passes the filters"
        page.uncheck("#errors")  # the open group stays open
        tokens = sum(len(t["ids"]) for r in group for t in r["tokens"])
        for colour in ("logprob", "ratio", "advantage", "outcome"):
            page.select_option("#colour", colour)
            spans = page.query_selector_all("#detail .rollout .tok")
            assert len(spans) == tokens, colour
            coloured = page.eval_on_selector_all(
                "#detail .rollout .tok", "spans => spans.filter(s => s.style.background).length")
            if colour in ("logprob", "advantage"):
                assert coloured > 0, colour
            if colour == "outcome":  # on policy (max_async_level 0, fp32): no token meets a bound
                assert coloured == 0 and "loss: kept" in spans[0].get_attribute("title")
            if colour == "ratio":  # on policy: 1 up to the two logprobs' rounding to 5 decimals
                ratio = float(re.search(r"ratio (\S+)", spans[1].get_attribute("title"))[1])
                assert abs(ratio - 1) < 1e-3, ratio
        shot = tmp_path / "viewer.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert errors == []


@pytest.mark.slow
@pytest.mark.parametrize("one_file", [True, False], ids=["steps in the page", "step files"])
def test_hostile_text_renders_as_text_and_runs_nothing(tmp_path, monkeypatch, one_file):
    from prime_rl.viewer import view

    monkeypatch.setattr(view, "ONE_FILE_MIB", 0)  # without --one-file every run's steps are files
    long_line = "x" * 100_000
    texts = ["</script><script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 2">',
             "\u202eright to left override", long_line]
    directory = rollout_dir(tmp_path, 0)
    directory.mkdir(parents=True)
    lines = []
    for rollout, text in enumerate(texts):
        line = rollout_line(0, 0, rollout, __import__("random").Random(rollout), text=text, tokens=4)
        line["error"] = '<b onmouseover="window.pwned = 3">bold</b>'
        line["messages"].append({"role": "tool", "content": [{"type": "text", "text": "<svg onload=alert(1)>"}]})
        lines.append(json.dumps(line).encode())
    lines.append(b'{"step": 0, "env": "bytes", "group": 1, "rollout": 0, "kept": true, "reward": 0.5, '
                 b'"completion": "invalid \xff\xfe utf-8", "messages": [], "tokens": []}')
    # what older files or a broken run can hold: NaN numbers, a -inf logprob, a sample the trainer cut and masked
    lines.append(b'{"step": 0, "env": null, "group": 2, "rollout": 0, "kept": true, "reward": NaN, "advantage": '
                 b'-Infinity, "completion": null, "tokens": [{"key": 9, "ids": [5, 6, 7, 8], "logprobs": [-1, '
                 b'-Infinity, NaN, -2], "sampled": [true, true, false, true]}]}')
    samples_file(directory).write_bytes(b"\n".join(lines) + b"\n")
    token_outcomes_file(directory, 0).write_text(
        '{"key": 9, "logprobs": [null, -1.0, -3.0], "advantages": [0.5, 0.5, 0], "outcomes": "xk-"}\n')
    path = write_view(tmp_path, one_file=one_file, decode=ids_as_letters)
    assert viewer_step_files(path).is_dir() is not one_file
    with chromium_page(width=1200) as (page, errors):
        open_page(page, path.as_uri() + "#step=0&group=2&colour=constructor")  # not a colouring: plain text
        assert page.text_content("#detail h2").startswith("group 2 · None")
        for colour in ("logprob", "ratio", "advantage", "outcome"):
            page.select_option("#colour", colour)
            assert len(page.query_selector_all("#detail .rollout .tok")) == 4, colour
        titles = page.eval_on_selector_all("#detail .rollout .tok", "spans => spans.map(s => s.title)")
        assert "loss: non-finite ratio" in titles[0] and "cut to seq_len" in titles[3]
        page.select_option("#env", "None")
        assert page.text_content("#detail h2").endswith("1 of 1 rollouts shown")
        page.goto("about:blank")
        open_page(page, path.as_uri())
        page.click(".group-card[data-group='0']")
        text = page.inner_text("#detail")
        assert texts[0] in text and texts[1] in text and "<svg onload=alert(1)>" in text
        assert page.evaluate("window.pwned") is None
        assert page.evaluate("document.querySelectorAll('img, svg image, b, iframe, object, embed').length") == 0
        assert page.evaluate("document.scripts.length") == len(page.query_selector_all("script"))  # none added
        assert page.evaluate("document.documentElement.scrollWidth") <= 1200  # a 100k line stays in its column
        bidi = page.eval_on_selector("#detail .rollout .text", "e => getComputedStyle(e).unicodeBidi")
        assert bidi == "isolate"
        page.click(".group-card[data-group='1']")
        assert "invalid \ufffd\ufffd utf-8" in page.inner_text("#detail")
        assert errors == []


@pytest.mark.slow
def test_a_run_of_400_steps_of_64_samples_opens_in_under_2_seconds_from_a_small_page(tmp_path):
    """33 MiB of rollouts: `prime-rl view` writes a page of the run's summary and a file per step beside it, which
    the page loads when the step is opened (from the file system, under the page's policy)."""
    root = samples_run(tmp_path, steps=400, groups=8, per_group=8)
    path = write_view(root, decode=ids_as_letters)
    assert path.stat().st_size < 2**20 and viewer_step_files(path).is_dir()
    with chromium_page() as (page, errors):
        start = time.perf_counter()
        open_page(page, path.as_uri())
        opened = time.perf_counter() - start
        start = time.perf_counter()
        page.click("#curve rect[data-step='399']")
        page.wait_for_selector("#summary >> text=/^step 399:/")  # its file loaded (no eval: the page's policy)
        page.click(".group-card[data-group='7']")
        page.select_option("#colour", "ratio")
        browsed = time.perf_counter() - start
        assert page.text_content("#summary").startswith("step 399: 64 rollouts in 8 groups")
        assert errors == []
        viewer_step_file(viewer_step_files(path), 398).unlink()  # a step file lost: the page says so
        page.click("#curve rect[data-step='398']")
        page.wait_for_selector("text=cannot load")
        viewer_step_file(viewer_step_files(path), 397).write_text("// cut short\n")  # one that holds no step
        page.click("#curve rect[data-step='397']")
        page.wait_for_selector("text=does not hold step 397")
    print(f"page {path.stat().st_size / 2**20:.2f} MiB: opened in {opened:.2f} s, last step's file, group and "
          f"colouring in {browsed:.2f} s")
    assert opened < 2.0, opened
