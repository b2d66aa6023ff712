"""Where the zoo keeps what it trained: one folder per ZOO_VERSION and torch and transformers release
(their models' parameter names and numbers change between releases), holding each case's Run and the
states of the models pretrained inside the bench for the fine-tuning cases."""

from __future__ import annotations

from pathlib import Path

#: bump whenever a case, a model, a task or the training loop changes: cached runs are then stale
ZOO_VERSION = 8

DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".zoo-cache"


def cache_root(cache_dir=DEFAULT_CACHE) -> Path:
    """This release's folder under ``cache_dir``."""
    import torch
    import transformers

    return Path(cache_dir) / f"v{ZOO_VERSION}-torch{torch.__version__}-transformers{transformers.__version__}"
