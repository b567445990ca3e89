"""What a test reads of an agent session's segments (`orchestrator/agent_stitching.Segment`)."""

from __future__ import annotations


def sampled_runs(segment) -> list[list[int]]:
    """The segment's runs of sampled (mask 1) ids, in order: one per call."""
    runs, current = [], []
    for token, keep in zip(segment.token_ids, segment.mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    return runs + ([current] if current else [])
