"""The rollout viewer: `prime-rl view <run dir>` writes one self-contained HTML page of the run's samples on disk
(`collect.py` reads them, `page.py` writes the page, `assets/` holds its script and style)."""
