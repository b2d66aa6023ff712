"""Real data that ships inside installed packages, so the zoo trains on what people train on without
downloading anything: scikit-learn's bundled sets (digits, wine, breast cancer, diabetes) and English
text from the Python distribution (the language reference in ``pydoc_data.topics``, stdlib docstrings).

Each loader returns a ``data.Task`` holding the data *as it is stored* (pixels 0-255, raw clinical
and chemical measurements, characters) and the preprocessing a careful user applies to each batch
(``prepare``: pixels / 255 then normalised, a StandardScaler fitted on the data); forgetting it
(``raw``) is a mistake the zoo injects (mistakes.skip_preprocessing).
"""

from __future__ import annotations

import functools
import inspect

import numpy as np
import torch

from .data import Task

#: the characters of the text tasks: newline and printable ASCII; id 0 is padding / anything else
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
TEXT_VOCAB = len(ALPHABET) + 1
#: stdlib modules whose docstrings are the fine-tuning text and the classification classes
DOC_MODULES: tuple[tuple[str, ...], ...] = (
    ("builtins",),
    ("os", "os.path", "shutil", "pathlib"),
    ("collections", "itertools", "functools", "heapq", "bisect"),
)


def encode(text: str) -> torch.Tensor:
    """Character ids (1..len(ALPHABET)); characters outside the alphabet become 0."""
    lut = np.zeros(128, dtype=np.int64)
    lut[[ord(c) for c in ALPHABET]] = np.arange(1, len(ALPHABET) + 1)
    codes = np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8).astype(np.int64)
    return torch.from_numpy(lut[np.minimum(codes, 127)])


@functools.cache
def reference_text() -> str:
    """The Python language reference as shipped for ``help()`` (pydoc_data.topics), ~460k characters."""
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


@functools.cache
def docstrings(modules: tuple[str, ...]) -> str:
    """Every docstring of ``modules`` and their public members, joined (stdlib English prose)."""
    import importlib

    parts = []
    for name in modules:
        mod = importlib.import_module(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(dir(mod)):
            if not attr.startswith("_"):
                doc = inspect.getdoc(getattr(mod, attr, None))
                if doc and doc not in parts:
                    parts.append(doc)
    return "\n".join(parts)


def _windows(ids: torch.Tensor, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, len(ids) - length - 1, (n,), generator=g)
    return ids[start[:, None] + torch.arange(length + 1)]


def text_lm(seed: int, source: str = "reference", n: int = 1024, length: int = 32, batch_size: int = 16) -> Task:
    """Next-character prediction on windows of English text: ``source`` "reference" (the language
    reference) or "docstrings" (stdlib docstrings: the fine-tuning text of a model pretrained on the
    reference). ``y`` is ``x`` shifted by one."""
    text = reference_text() if source == "reference" else "\n".join(docstrings(m) for m in DOC_MODULES)
    w = _windows(encode(text), n, length, torch.Generator().manual_seed(seed))
    return Task(w[:, :-1].contiguous(), w[:, 1:].contiguous(), batch_size, seed)


def text_source(seed: int, n: int = 1024, length: int = 32, batch_size: int = 32) -> Task:
    """Which text a 32-character snippet comes from: the language reference or one of the
    DOC_MODULES groups' docstrings (4 classes). Position 0 holds a [CLS]-like id (0)."""
    g = torch.Generator().manual_seed(seed)
    texts = [reference_text()] + [docstrings(m) for m in DOC_MODULES]
    per = n // len(texts)
    xs = [_windows(encode(t), per, length - 2, g) for t in texts]
    x = torch.cat(xs)
    x = torch.cat([torch.zeros(len(x), 1, dtype=torch.long), x], dim=1)
    y = torch.arange(len(texts)).repeat_interleave(per)
    return Task(x, y, batch_size, seed)


def text_recase(seed: int, n: int = 1024, length: int = 24, batch_size: int = 16) -> Task:
    """Sequence to sequence: restore the capitals of lower-cased reference text (T5, BART)."""
    w = _windows(encode(reference_text()), n, length, torch.Generator().manual_seed(seed))[:, :length]
    lower = torch.tensor([ALPHABET.index(c.lower()) + 1 for c in ALPHABET])
    lut = torch.cat([torch.zeros(1, dtype=torch.long), lower])
    return Task(lut[w], w.contiguous(), batch_size, seed)


def _scaler(x: torch.Tensor):
    """A StandardScaler fitted on the whole set, applied per batch (what the careful user does)."""
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(x.numpy())
    mean, scale = torch.tensor(sc.mean_, dtype=torch.float32), torch.tensor(sc.scale_, dtype=torch.float32)
    return lambda b: (b.float() - mean) / scale


def digits_images(seed: int, batch_size: int = 32, classes: tuple[int, ...] = tuple(range(10))) -> Task:
    """scikit-learn's 8x8 handwritten digits as 1 x 8 x 8 uint8 images (its 0-16 grey levels
    stretched to 0-255, as images are stored). ``prepare`` is ToTensor + Normalize: / 255, then the
    set's mean and std. ``classes`` keeps some digits (a pretraining set and a fine-tuning set)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = np.isin(d.target, classes)
    pix = np.round(d.data[keep] * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 1, 8, 8)
    x = torch.from_numpy(pix)
    y = torch.from_numpy(d.target[keep]).long()
    unit = x.float() / 255.0
    mean, std = float(unit.mean()), float(unit.std())
    return Task(x, y, batch_size, seed, prepare=lambda b: (b.float() / 255.0 - mean) / std, raw=lambda b: b.float())


def _tabular(load, seed: int, batch_size: int, regression: bool = False) -> Task:
    b = load()
    x = torch.tensor(b.data, dtype=torch.float32)
    if regression:
        y = torch.tensor(b.target, dtype=torch.float32)[:, None]
        y = (y - y.mean()) / y.std()  # the target standardised too, as with sklearn's TransformedTargetRegressor
    else:
        y = torch.tensor(b.target).long()
    return Task(x, y, batch_size, seed, prepare=_scaler(x), raw=lambda t: t.float(), regression=regression)


def wine(seed: int, batch_size: int = 16) -> Task:
    """178 wines, 13 chemical measurements (proline up to 1680), 3 cultivars."""
    from sklearn.datasets import load_wine

    return _tabular(load_wine, seed, batch_size)


def breast_cancer(seed: int, batch_size: int = 32) -> Task:
    """569 tumours, 30 measurements (areas up to 4254), malignant or benign."""
    from sklearn.datasets import load_breast_cancer

    return _tabular(load_breast_cancer, seed, batch_size)


def diabetes(seed: int, batch_size: int = 32) -> Task:
    """442 patients, 10 raw baseline variables (age, sex, BMI, blood pressure, six serum
    measurements), disease progression after a year: regression (mean squared error)."""
    from sklearn.datasets import load_diabetes

    return _tabular(functools.partial(load_diabetes, scaled=False), seed, batch_size, regression=True)


def digits_flat(seed: int, batch_size: int = 32) -> Task:
    """The digits as 64 raw grey levels (0-16) per row, a StandardScaler before the MLP."""
    from sklearn.datasets import load_digits

    return _tabular(load_digits, seed, batch_size)
