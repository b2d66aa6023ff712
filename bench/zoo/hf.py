"""The zoo's transformers models, built from tiny configs of their real classes (random init, no
download). Dropout is off unless a case asks for it (``dropout``, the libraries' default 0.1) so
healthy runs are deterministic; sizes are keyword arguments so one
architecture fits the synthetic tasks and the real ones (8 x 8 grey digits, a 97-character text)."""

from __future__ import annotations

from torch import nn


def gpt2(vocab: int = 64, layers: int = 2, positions: int = 32, dropout: float = 0.0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=32,
        n_layer=layers,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(cfg)


def llama(vocab: int = 97, layers: int = 2) -> nn.Module:
    """Llama: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no bias anywhere."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def mixtral(vocab: int = 97, experts: int = 4) -> nn.Module:
    """A sparse mixture of experts (Mixtral): a router picks 2 of ``experts`` SwiGLU experts per token."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return MixtralForCausalLM(cfg)


def t5(vocab: int = 97) -> nn.Module:
    """T5 encoder-decoder: RMS layer norms, relative position buckets, ReLU feed-forward, no biases."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=vocab,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5ForConditionalGeneration(cfg)


def bert(vocab: int = 64, labels: int = 4, dropout: float = 0.0) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    cfg.num_labels = labels
    return BertForSequenceClassification(cfg)


def distilbert(vocab: int = 64, labels: int = 4, layers: int = 3) -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(
        vocab_size=vocab,
        dim=32,
        n_layers=layers,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
        pad_token_id=0,
    )
    cfg.num_labels = labels
    return DistilBertForSequenceClassification(cfg)


def resnet(channels: int = 3, labels: int = 4) -> nn.Module:
    """ResNet with basic blocks (ResNet-18's kind) and BatchNorm."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=channels, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    cfg.num_labels = labels
    return ResNetForImageClassification(cfg)


def convnext(channels: int = 1, labels: int = 10) -> nn.Module:
    """ConvNeXt: depthwise 7x7 convolutions, LayerNorm instead of BatchNorm, GELU, layer scale."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(
        num_channels=channels, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, patch_size=2, num_labels=labels
    )
    return ConvNextForImageClassification(cfg)


def vit(channels: int = 3, size: int = 32, patch: int = 8, labels: int = 4, dropout: float = 0.0) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=size,
        patch_size=patch,
        num_channels=channels,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    cfg.num_labels = labels
    return ViTForImageClassification(cfg)
