"""(stub: being written) The model registry: public models by Hugging Face id."""

from __future__ import annotations

from .reading import Reading


def model_reading(name: str) -> Reading | None:
    """The Megatron-Core fields of a registered model (by HF id, case-insensitive, or alias),
    each with Origin("model", "<id> config.json (<source url>)", "<hf key>"); None if unknown."""
    return None
