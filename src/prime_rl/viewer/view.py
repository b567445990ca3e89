"""`prime-rl`: the project's tools that are not a run's processes.

    prime-rl view <run dir> [-o page.html] [--steps A:B] [--one-file] [--serve] [--port N]

`view` writes the run's rollout viewer (`viewer.html` in the run directory unless `-o` says where; docs/rollouts.md)
and, with `--serve`, also serves it on 127.0.0.1 until interrupted. A run whose rollouts take more than
`ONE_FILE_MIB` is written as a small page and one file per step in `viewer_steps/` beside it (`viewer/page.py`),
unless `--one-file`. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import http.server
import re
import sys
import time
import urllib.parse
from pathlib import Path

from prime_rl.configs.cli import fail
from prime_rl.run_dir import viewer_page, viewer_step_file, viewer_step_files
from prime_rl.utils.disk import as_disk_error
from prime_rl.utils.errors import PrimeError, UserError
from prime_rl.utils.fs import atomic_dir, atomic_write_text, remove_dir
from prime_rl.viewer.collect import collect
from prime_rl.viewer.page import render_page, step_script

STEP_FILE = re.compile(r"^step_(\d+)\.js$")  # the files of a page's step folder (`run_dir.viewer_step_file`)
ONE_FILE_MIB = 4  # a run's rollouts up to this size are embedded in the page (one file), larger ones are step files


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
    view.add_argument("--one-file", action="store_true",
                      help=f"embed every step in the page, however large (default: up to {ONE_FILE_MIB} MiB)")
    view.add_argument("--serve", action="store_true", help="also serve the page on 127.0.0.1 until interrupted")
    view.add_argument("--port", type=int, default=0, help="the port to serve on (0: any free one)")
    return top


def write_view(run_dir: Path, out: Path | None = None, steps: range | None = None, one_file: bool = False,
               decode=None) -> Path:
    """Write the viewer of `run_dir` (to `out`, default `viewer_page(run_dir)`); returns the page's path. Rollouts
    of more than `ONE_FILE_MIB` (unless `one_file`) go to step files in `viewer_step_files(page)`, written first,
    the folder renamed into place whole, then the page; a page of one file removes such a folder of an earlier
    write. `decode`: token ids -> texts (default: the run's tokenizer, `collect`)."""
    path = out if out is not None else viewer_page(run_dir)
    folder = viewer_step_files(path)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is where this page's step files go, but it is a file: move it, or use -o")
    strangers = sorted(p.name for p in folder.iterdir() if not STEP_FILE.match(p.name)) if folder.is_dir() else []
    if strangers:
        raise UserError(f"{folder} is where this page's step files go, but it holds other files ({strangers[0]}, ...):"
                        f" move them, or write the page elsewhere with -o")
    run = collect(run_dir, steps, decode)
    scripts = {step: step_script(step, rows) for step, rows in run.steps.items()}
    split = not one_file and sum(len(text) for text in scripts.values()) > ONE_FILE_MIB * 2**20
    try:
        if split:
            with atomic_dir(folder) as tmp:
                for step, text in scripts.items():
                    viewer_step_file(tmp, step).write_text(text, encoding="ascii")
        atomic_write_text(path, render_page(run_dir, run, folder.name if split else None))
        if not split and folder.is_dir():
            remove_dir(folder)
    except OSError as exc:
        raise as_disk_error(exc, path.parent) or UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def page_server(page: Path, port: int) -> http.server.ThreadingHTTPServer:
    """A server (not yet serving) of `page` at / and of its step files (`viewer_step_files`) on 127.0.0.1:`port`;
    nothing else: any other path is a 404."""
    body = page.read_bytes()
    folder = viewer_step_files(page)
    in_folder = f"/{folder.name}/"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)  # the script escapes the names
            if path in ("/", "/viewer.html", f"/{page.name}"):
                self.answer("text/html; charset=utf-8", body)
                return
            step = STEP_FILE.match(path.removeprefix(in_folder)) if path.startswith(in_folder) else None
            data = viewer_step_file(folder, int(step.group(1))) if step else None
            if data is None or not data.is_file():
                self.send_error(404)
                return
            self.answer("text/javascript; charset=utf-8", data.read_bytes())

        def answer(self, content_type: str, content: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve(page: Path, port: int) -> None:
    """Serve `page_server` until interrupted."""
    with page_server(page, port) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.port and not args.serve:
        fail("prime-rl view: --port is the port of --serve; add --serve", 2)
    try:
        start = time.perf_counter()
        page = write_view(args.run_dir, args.out, args.steps, args.one_file)
        folder = viewer_step_files(page)
        files = list(folder.glob("step_*.js")) if folder.is_dir() else []
        beside = (f" and {len(files)} step files in {folder.name}/ beside it "
                  f"({sum(f.stat().st_size for f in files) / 2**20:.1f} MiB)" if files else "")
        print(f"wrote {page} ({page.stat().st_size / 2**20:.1f} MiB){beside}, {time.perf_counter() - start:.1f} s: "
              f"open it in a browser", flush=True)
        if args.serve:
            serve(page, args.port)
    except PrimeError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
