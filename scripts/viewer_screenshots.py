"""The screenshots of docs/rollouts.md: a run's viewer page in headless Chromium (Debian's, driven by Playwright as
the browser tests drive it), one group side by side as text and coloured by the sampler's logprob.

    uv run python scripts/viewer_screenshots.py outputs/reverse_text --step 40 --group 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.browser import chromium_page, open_page  # noqa: E402

from prime_rl.viewer.view import write_view  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, default=40)
    parser.add_argument("--group", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    page_file = write_view(args.run_dir).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    with chromium_page(width=1280, height=760) as (page, errors):
        for name, colour in (("viewer_group.png", "text"), ("viewer_tokens.png", "logprob")):
            open_page(page, f"{page_file.as_uri()}#step={args.step}&group={args.group}&colour={colour}")
            page.screenshot(path=str(args.out / name))
            print(f"wrote {args.out / name}")
        if errors:
            raise SystemExit(f"the page logged errors: {errors}")


if __name__ == "__main__":
    main()
