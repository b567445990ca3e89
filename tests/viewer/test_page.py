"""The viewer's page as a file (`viewer/page.py`): run text cannot become markup or script, the page's policy lets
only its own script and style run, and the script puts text on the page only as text."""

from __future__ import annotations

import json
import re

from prime_rl.viewer.collect import RunSamples
from prime_rl.viewer.page import asset, csp_hash, json_block, render_page

HOSTILE = ["</script><script>window.pwned = 1</script>", "<img src=x onerror=alert(1)>", "a & b > c",
           "\u202eevil\u202c", "\ufffd\ud800 lone surrogate", "\u2028line\u2029separators", "<!-- ", "]]>"]


def test_embedded_json_has_no_markup_characters_and_reads_back_exactly():
    block = json_block({"texts": HOSTILE})
    assert not set(block) & set("<>&") and block.isascii()
    assert json.loads(block) == {"texts": HOSTILE}


def test_the_policy_runs_only_the_pages_own_script_and_style(tmp_path):
    run = RunSamples("run </title><script>", {0: [{"step": 0, "env": "e", "group": 0, "completion": HOSTILE[0]}]}, {})
    page = render_page(tmp_path, run)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert policy == (f"default-src 'none'; script-src {csp_hash(asset('viewer.js'))}; "
                      f"style-src {csp_hash(asset('viewer.css'))}; img-src data:")
    scripts = re.findall(r"<script( [^>]*)?>", page)
    assert scripts.count("") == 1 and all('type="application/json"' in s for s in scripts if s)  # one executable
    assert "<title>rollouts of run &lt;/title&gt;&lt;script&gt;</title>" in page
    assert page.count("</script>") == len(scripts)  # no text of the run closes a block


def test_the_script_never_parses_text_as_markup_or_code():
    script = asset("viewer.js")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                 "setTimeout(\"", "createContextualFragment", "srcdoc", "<script", "</script", "<!--"):
        assert sink not in script, sink


def test_non_finite_numbers_become_null_and_words_that_look_like_them_stay():
    block = json_block({"reward": float("nan"), "lp": [-float("inf"), 1.5], "text": "NaN and -Infinity"})
    assert json.loads(block) == {"reward": None, "lp": [None, 1.5], "text": "NaN and -Infinity"}
