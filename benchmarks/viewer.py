"""What the rollout viewer costs: writing the viewer of a run of `--steps` x `--groups` x `--per-group` rollouts of
`--tokens` tokens each as `prime-rl view` does (collect + render + the step files of a large run, token text given),
the page's size and the step files', and opening it in headless Chromium (Debian's, driven by Playwright as
tests/viewer drive it): from navigation until the page has rendered, then the last step (its file loaded), a group
and the ratio colouring.

    uv run python benchmarks/viewer.py [--steps 400] [--groups 8] [--per-group 8] [--tokens 40] [--repeats 3]
    uv run python benchmarks/viewer.py --steps 1000 --groups 64 --per-group 8 --tokens 16 --repeats 1

Medians of `--repeats`; the machine's speed is measured first (benchmarks/machine_speed.py's import time) as the
reference.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.browser import chromium_page, open_page  # noqa: E402
from tests.support.sample_runs import samples_run  # noqa: E402

from prime_rl.run_dir import viewer_page, viewer_step_files  # noqa: E402
from prime_rl.viewer.view import write_view  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    speed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "machine_speed.py"), "--repeats", "1"],
                           capture_output=True, text=True).stdout.strip()
    print(speed)
    with tempfile.TemporaryDirectory() as tmp:
        root = samples_run(Path(tmp), args.steps, args.groups, args.per_group, args.tokens)
        builds, opens, browses = [], [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            write_view(root, decode=lambda ids: {i: chr(97 + i % 26) for i in ids})
            builds.append(time.perf_counter() - start)
        size = viewer_page(root).stat().st_size
        folder = viewer_step_files(viewer_page(root))
        files = sum(f.stat().st_size for f in folder.glob("step_*.js")) if folder.is_dir() else 0
        with chromium_page() as (page, errors):
            for _ in range(args.repeats):
                start = time.perf_counter()
                open_page(page, viewer_page(root).as_uri() + f"#r{len(opens)}")  # a new address: a fresh load
                opens.append(time.perf_counter() - start)
                start = time.perf_counter()
                page.click(f"#curve rect[data-step='{args.steps - 1}']")
                page.wait_for_selector(f"#summary >> text=/^step {args.steps - 1}:/")  # no eval: the policy
                page.click(f".group-card[data-group='{args.groups - 1}']")
                page.select_option("#colour", "ratio")
                browses.append(time.perf_counter() - start)
                page.goto("about:blank")
            assert not errors, errors
    rollouts = args.steps * args.groups * args.per_group
    print(f"{args.steps} steps x {args.groups * args.per_group} rollouts ({rollouts:,}) of {args.tokens} tokens: "
          f"page {size / 2**20:.2f} MiB + step files {files / 2**20:.1f} MiB, built in "
          f"{statistics.median(builds):.2f} s, opened in "
          f"{statistics.median(opens):.2f} s, last step + group + ratio colouring in "
          f"{statistics.median(browses):.2f} s")


if __name__ == "__main__":
    main()
