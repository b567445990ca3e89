"""`prime-rl`: the project's tools that are not a run's processes.

    prime-rl view <run dir> [-o page.html] [--steps A:B] [--serve] [--port N]

`view` writes the run's rollout viewer (`viewer.html` in the run directory unless `-o` says where; docs/rollouts.md)
and, with `--serve`, also serves it on 127.0.0.1 until interrupted. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import http.server
import sys
import time
from pathlib import Path

from prime_rl.configs.cli import fail
from prime_rl.run_dir import viewer_page
from prime_rl.utils.disk import as_disk_error
from prime_rl.utils.errors import PrimeError, UserError
from prime_rl.utils.fs import atomic_write_text
from prime_rl.viewer.collect import collect
from prime_rl.viewer.page import render_page


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are the project's one line, exit 2."""

    def error(self, message: str):
        fail(f"{self.prog}: {message}", 2)


def parse_steps(text: str) -> range:
    """'A:B' (both ends included; either may be left out) as a range of steps."""
    first, sep, last = text.partition(":")
    try:
        start = int(first) if first else 0
        stop = (int(last) if last else sys.maxsize - 1) + 1 if sep else start + 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: expected A:B, A: or :B with step numbers") from None
    if stop <= start:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: the last step comes before the first")
    return range(start, stop)


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="prime-rl", description="prime-rl's tools")
    commands = top.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    view = commands.add_parser("view", help="write (and serve) a run's rollout viewer")
    view.add_argument("run_dir", type=Path, help="the run's output directory (outputs/<run>)")
    view.add_argument("-o", "--out", type=Path, help="where to write the page (default: <run dir>/viewer.html)")
    view.add_argument("--steps", type=parse_steps, help="only these steps, A:B (both included)")
    view.add_argument("--serve", action="store_true", help="also serve the page on 127.0.0.1 until interrupted")
    view.add_argument("--port", type=int, default=0, help="the port to serve on (0: any free one)")
    return top


def write_view(run_dir: Path, out: Path | None = None, steps: range | None = None) -> Path:
    """Write the viewer page of `run_dir` (to `out`, default `viewer_page(run_dir)`) atomically; returns its path."""
    run = collect(run_dir, steps)
    path = out if out is not None else viewer_page(run_dir)
    try:
        atomic_write_text(path, render_page(run_dir, run))
    except OSError as exc:
        raise as_disk_error(exc, path.parent) or UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def serve(page: Path, port: int) -> None:
    """Serve `page` at / on 127.0.0.1:`port` until interrupted (nothing else is served)."""
    body = page.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            if self.path.split("#")[0] not in ("/", "/viewer.html"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.port and not args.serve:
        fail("prime-rl view: --port is the port of --serve; add --serve", 2)
    try:
        start = time.perf_counter()
        page = write_view(args.run_dir, args.out, args.steps)
        print(f"wrote {page} ({page.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - start:.1f} s): "
              f"open it in a browser", flush=True)
        if args.serve:
            serve(page, args.port)
    except PrimeError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
