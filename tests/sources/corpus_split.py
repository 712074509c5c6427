"""The reader corpus' split: fixed once by a hash of each artefact's source URL."""

from __future__ import annotations

import hashlib


def split_of(source_url: str) -> str:
    """`held-out` for about 3 in 10 sources, `development` for the rest, forever."""
    digest = int(hashlib.sha256(source_url.strip().encode()).hexdigest()[:8], 16)
    return "held-out" if digest % 10 < 3 else "development"
