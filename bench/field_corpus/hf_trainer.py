"""transformers' ``Trainer`` (its AdamW, linear decay, clipping at 1) on causal language modelling,
recorded by gradwidget's ``GradwidgetCallback``: a 2-layer GPT-2 from a config (random init, nothing
downloaded) predicting the next character of the Python language reference. Healthy: the held-out
loss falls below the characters' unigram entropy."""

from __future__ import annotations

import math

from .case import Health


def gpt2_trainer_text():
    import tempfile

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from gradwidget.integrations.transformers import GradwidgetCallback

    from .data import reference_ids

    ids, vocab = reference_ids()
    block = 64
    windows = ids[: len(ids) // block * block].reshape(-1, block)
    train, held = windows[:-200], windows[-200:]

    class Blocks(torch.utils.data.Dataset):
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return {"input_ids": self.rows[i], "labels": self.rows[i]}

    counts = torch.bincount(train.reshape(-1), minlength=vocab).double()
    p = counts[counts > 0] / counts.sum()
    unigram = float(-(p * p.log()).sum())
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab, n_positions=block, n_embd=64, n_layer=2, n_head=2, bos_token_id=None, eos_token_id=None
        )
    )
    cb = GradwidgetCallback()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=200,
            per_device_train_batch_size=16,
            learning_rate=1e-3,
            warmup_steps=20,
            logging_steps=50,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=Blocks(train), eval_dataset=Blocks(held), callbacks=[cb]
        )
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
    return cb.run, Health(
        f"held-out loss (unigram entropy {unigram:.2f}, ln V {math.log(vocab):.2f})",
        before,
        after,
        "after <= 0.85x unigram entropy",
        after <= 0.85 * unigram,
    )


def vit_trainer_digits():
    """transformers' ``Trainer`` on image classification: a 2-layer ``ViTForImageClassification``
    from a config (2x2 patches of the 8x8 digits, random init), ``pixel_values`` and ``labels`` as
    the Trainer's data collator passes them, 400 steps at batch 32. Healthy: held-out accuracy."""
    import tempfile

    import numpy as np
    import torch
    from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

    from gradwidget.integrations.transformers import GradwidgetCallback

    from .data import digits

    x, y, order = digits()
    images = (x.reshape(-1, 1, 8, 8) - 0.5) / 0.5
    train, held = order[:1400], order[1400:]

    class Images(torch.utils.data.Dataset):
        def __init__(self, idx):
            self.idx = idx

        def __len__(self):
            return len(self.idx)

        def __getitem__(self, i):
            j = self.idx[i]
            return {"pixel_values": images[j], "labels": y[j]}

    def accuracy(pred) -> dict:
        return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        num_labels=10,
    )
    model = ViTForImageClassification(cfg)
    cb = GradwidgetCallback()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=400,
            per_device_train_batch_size=32,
            learning_rate=1e-3,
            warmup_steps=30,
            logging_steps=100,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Images(train),
            eval_dataset=Images(held),
            compute_metrics=accuracy,
            callbacks=[cb],
        )
        before = trainer.evaluate()["eval_accuracy"]
        trainer.train()
        after = trainer.evaluate()["eval_accuracy"]
    return cb.run, Health("held-out accuracy", before, after, "after >= 0.9", after >= 0.9)
