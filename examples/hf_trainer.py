"""Record a Hugging Face ``Trainer`` run: a tiny GPT-2 learning to copy a token sequence, with
gradient accumulation and clipping, bf16 autocast optional.

    python examples/hf_trainer.py --log-dir runs/hf --steps 30 [--bf16]

``GradwidgetCallback`` records one step per optimizer update, after accumulation and AMP
unscaling, with the Trainer's loss and learning rate; since the Trainer clips (``max_grad_norm``),
the run's ``global_norm`` is the norm before clipping (the Trainer's logged ``grad_norm``).
In a notebook, ``GradientPanel(callback)`` follows the training (examples/hf_trainer.ipynb).
"""
from __future__ import annotations

import argparse

import torch
import transformers

from gradwidget import summary
from gradwidget.integrations.transformers import GradwidgetCallback


def make_trainer(steps: int = 30, log_dir=None, bf16: bool = False, output_dir: str = "runs/hf_out",
                 lr: float = 3e-3, max_grad_norm: float = 1.0):
    """A tiny GPT-2, a synthetic copy task and a Trainer with a GradwidgetCallback: (trainer, callback)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=1)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    half = torch.randint(2, 128, (256, 16), generator=g)
    data = [{"input_ids": t, "labels": t} for t in torch.cat([half, half], dim=1)]  # second half copies the first
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        learning_rate=lr, max_grad_norm=max_grad_norm, logging_steps=5, bf16=bf16, use_cpu=True,
        report_to=[], save_strategy="no", disable_tqdm=True)
    callback = GradwidgetCallback(log_dir=log_dir)
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]), callback


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args(argv)
    trainer, cb = make_trainer(args.steps, args.log_dir, args.bf16)
    trainer.train()
    print(summary(cb.run))


if __name__ == "__main__":
    main()
