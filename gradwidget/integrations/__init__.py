"""Trainer callbacks that record gradients where the trainer steps: ``integrations.transformers``
(a Hugging Face ``TrainerCallback``) and ``integrations.lightning`` (a Lightning ``Callback``).

Each submodule imports its library; importing ``gradwidget`` or this package imports neither.
"""
