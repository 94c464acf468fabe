"""Held-out models for the compiler's public-corpus runner (issue 18): public models that are not
in the corpus (``transformers``' LlamaForCausalLM, DistilBertForSequenceClassification and
BartForConditionalGeneration from tiny configs, no weights; since session 27 lucidrains'
``x-transformers`` (a decoder-only LM with rotary embeddings, the same with its layers' weights
tied, and an encoder with other options), since session 36 ``transformers``' ResNet and ConvNeXt
(and since session 37 MobileViT with attention dropout) trained with AdamW
and ``keras-hub`` (GPT-2 causal LM and a BERT classifier from 2-layer configs), since session 41
``transformers``' Mistral, GPT-NeoX, ViT, Swin and Whisper, since session 34
``timm`` (PyTorch Image Models: EfficientNet-B0, GhostNet, ConvNeXt-atto, ResNet10-T, a ViT-tiny
and MobileViT-XXS, no weights, at 64x64 or 32x32), each skipped
with the reason when its package is not importable), measured by the same runner as the
corpus (``compiler_corpus.bench_case``): eager, ``torch.compile`` and microco per run length
(300, 1,000, 5,000), each a first run on this machine told that length, then all interleaved
with an A/A control (a second eager instance; the rounds' orders balanced so that each runs
after each other equally often; medians of wall and of process CPU time per step); each run
length's total is a contender's measured first steps (compile, exploration, a warm-up step)
plus the remaining steps at its interleaved median (the JSON's ``totals``).

``microco bench compiler --corpus heldout [--models hf-llama,hf-distilbert,hf-bart,hf-resnet-adamw,xt-decoder,xt-encoder,
xt-tied,khub-gpt2,khub-bert,timm-efficientnet-b0,...] --json``,
or ``python -m microco.benchmarks.compiler_heldout [the same options]``.
"""

from __future__ import annotations

import sys
from typing import Any

from .compiler_corpus import (
    HF_BATCH,
    HF_LEN,
    HF_VOCAB,
    SKIPPED,
    Case,
    hf_ids,
    import_torchvision,
    transformers_or_skip,
)

HF_MODELS = ("hf-llama", "hf-distilbert", "hf-bart")
# (session 41) transformers' Mistral (sliding-window attention, tied embeddings), GPT-NeoX
# (parallel residual, partial rotary, dropout), ViT and Swin (AdamW; Swin's shifted windows and
# drop-path) and Whisper (log-mel features through convolutions into an encoder-decoder)
HF41_MODELS = ("hf-mistral", "hf-gptneox", "hf-vit-adamw", "hf-swin-adamw", "hf-whisper")
# transformers' vision models with convolutions, trained with AdamW (session 36: a stateful
# optimiser beside a channels-last trial; the corpus's plain SGD has no state)
# (session 37: and MobileViT, convolutions around attention blocks with attention dropout: the
# dropout over ``[B, heads, N, N]`` probabilities beside channels-last convolutions)
HF_VISION_MODELS = ("hf-resnet-adamw", "hf-convnext-adamw", "hf-mobilevit-adamw")
XT_MODELS = ("xt-decoder", "xt-encoder", "xt-tied")  # lucidrains' x-transformers (PyPI: x-transformers)
KHUB_MODELS = ("khub-gpt2", "khub-bert")  # keras-hub (PyPI: keras-hub), TensorFlow backend
# timm (PyPI: timm): name here -> (timm's model name, image side, its options)
TIMM: dict[str, tuple[str, int, dict[str, Any]]] = {
    "timm-efficientnet-b0": ("efficientnet_b0", 64, {}),
    "timm-ghostnet": ("ghostnet_100", 64, {}),
    "timm-convnext-atto": ("convnext_atto", 64, {}),
    "timm-resnet10t": ("resnet10t", 64, {}),
    "timm-vit-tiny": ("vit_tiny_patch16_224", 32, {"img_size": 32, "patch_size": 4}),
    "timm-mobilevit-xxs": ("mobilevit_xxs", 64, {}),
}
TIMM_MODELS = tuple(TIMM)
MODELS = HF_MODELS + HF_VISION_MODELS + HF41_MODELS + XT_MODELS + KHUB_MODELS + TIMM_MODELS


def heldout() -> list[Case]:
    return (
        _hf_heldout()
        + _hf_vision_heldout()
        + _hf41_heldout()
        + _xt_heldout()
        + _khub_heldout()
        + _timm_heldout()
    )


def _import_or_skip(module: str, names: tuple[str, ...], pip: str) -> Any:
    """``module`` imported, or None with ``names`` reported skipped (the reason in ``SKIPPED``)."""
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a package that fails as it imports
        why = f"{module} is not importable ({type(exc).__name__}: {exc}); pip install {pip}"
        SKIPPED.update(dict.fromkeys(names, why))
        return None


def _hf_heldout() -> list[Case]:
    tr = transformers_or_skip(HF_MODELS)
    if tr is None:
        return []
    V, L, ids = HF_VOCAB, HF_LEN, hf_ids

    def llama() -> Any:
        cfg = tr.LlamaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L,
        )  # fmt: skip
        return tr.LlamaForCausalLM(cfg)

    def distilbert() -> Any:
        kw: dict[str, Any] = dict(
            vocab_size=V, dim=64, hidden_dim=128, n_layers=2, n_heads=2, max_position_embeddings=L,
            num_labels=3, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
        )  # fmt: skip
        cfg = tr.DistilBertConfig(**kw)  # (num_labels: the base config's keyword argument)
        return tr.DistilBertForSequenceClassification(cfg)

    def bart() -> Any:
        cfg = tr.BartConfig(
            vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            max_position_embeddings=L, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        )  # fmt: skip
        return tr.BartForConditionalGeneration(cfg)

    def lm(m: Any, x: Any, y: Any) -> Any:
        return m(input_ids=x, labels=x).loss

    def cls(m: Any, x: Any, y: Any) -> Any:
        return m(input_ids=x, labels=y).loss

    return [
        Case("hf-llama", "transformers.LlamaForCausalLM", llama, ids, lm),
        Case("hf-distilbert", "transformers.DistilBertForSequenceClassification", distilbert, ids, cls),
        Case("hf-bart", "transformers.BartForConditionalGeneration", bart, ids, lm),
    ]


def _hf_vision_heldout() -> list[Case]:
    """transformers' ResNet, ConvNeXt (drop-path 0.1) and MobileViT (hidden, attention and
    classifier dropout 0.1) from small configs, no weights, a batch of 8 random 64x64 images,
    their own classification loss, AdamW."""
    tr = transformers_or_skip(HF_VISION_MODELS)
    if tr is None:
        return []
    import torch

    def resnet() -> Any:
        cfg = tr.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], num_labels=10
        )
        return tr.ResNetForImageClassification(cfg)

    def convnext() -> Any:
        cfg = tr.ConvNextConfig(
            hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1], drop_path_rate=0.1, num_labels=10
        )
        return tr.ConvNextForImageClassification(cfg)

    def mobilevit() -> Any:
        cfg = tr.MobileViTConfig(
            image_size=64,
            hidden_sizes=[32, 48, 64],
            neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 80],
            num_labels=10,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            classifier_dropout_prob=0.1,
        )
        return tr.MobileViTForImageClassification(cfg)

    def images() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(5)
        return torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 10, (8,), generator=g)

    def cls(m: Any, x: Any, y: Any) -> Any:
        return m(pixel_values=x, labels=y).loss

    return [
        Case("hf-resnet-adamw", "transformers.ResNetForImageClassification, AdamW", resnet, images, cls,
             optimizer="adamw"),
        Case("hf-convnext-adamw", "transformers.ConvNextForImageClassification, AdamW", convnext, images, cls,
             optimizer="adamw"),
        Case("hf-mobilevit-adamw", "transformers.MobileViTForImageClassification (dropout 0.1), AdamW", mobilevit,
             images, cls, optimizer="adamw"),
    ]  # fmt: skip


def _hf41_heldout() -> list[Case]:
    """Session 41's transformers models from small configs, no weights: Mistral and GPT-NeoX
    causal LMs on the token batch, ViT and Swin classifiers on 8 random 32x32 images (AdamW),
    Whisper on random 16-bin log-mel features with 8 label tokens."""
    tr = transformers_or_skip(HF41_MODELS)
    if tr is None:
        return []
    import torch

    V, L, ids = HF_VOCAB, HF_LEN, hf_ids

    def mistral() -> Any:
        cfg = tr.MistralConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L,
            tie_word_embeddings=True, sliding_window=8,
        )  # fmt: skip
        return tr.MistralForCausalLM(cfg)

    def gptneox() -> Any:
        cfg = tr.GPTNeoXConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=L, rotary_pct=0.25, hidden_dropout=0.1,
            attention_dropout=0.1, use_parallel_residual=True,
        )  # fmt: skip
        return tr.GPTNeoXForCausalLM(cfg)

    def vit() -> Any:
        cfg = tr.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, num_labels=10, hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
        )  # fmt: skip
        return tr.ViTForImageClassification(cfg)

    def swin() -> Any:
        cfg = tr.SwinConfig(
            image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10, drop_path_rate=0.1,
        )  # fmt: skip
        return tr.SwinForImageClassification(cfg)

    def whisper() -> Any:
        cfg = tr.WhisperConfig(
            vocab_size=V, num_mel_bins=16, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, d_model=64, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_source_positions=16, max_target_positions=L, pad_token_id=0,
            decoder_start_token_id=1, eos_token_id=2, bos_token_id=1, dropout=0.1,
        )  # fmt: skip
        return tr.WhisperForConditionalGeneration(cfg)

    def images() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(5)
        return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)

    def features() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(6)  # (32 frames: the encoder's stride-2 convolution to 16)
        return torch.randn(HF_BATCH, 16, 32, generator=g), torch.randint(3, V, (HF_BATCH, 8), generator=g)

    def lm(m: Any, x: Any, y: Any) -> Any:
        return m(input_ids=x, labels=x).loss

    def cls(m: Any, x: Any, y: Any) -> Any:
        return m(pixel_values=x, labels=y).loss

    def asr(m: Any, x: Any, y: Any) -> Any:
        return m(input_features=x, labels=y).loss

    return [
        Case("hf-mistral", "transformers.MistralForCausalLM (tied, sliding window)", mistral, ids, lm),
        Case("hf-gptneox", "transformers.GPTNeoXForCausalLM (dropout 0.1)", gptneox, ids, lm),
        Case("hf-vit-adamw", "transformers.ViTForImageClassification, AdamW", vit, images, cls, optimizer="adamw"),
        Case("hf-swin-adamw", "transformers.SwinForImageClassification, AdamW", swin, images, cls,
             optimizer="adamw"),
        Case("hf-whisper", "transformers.WhisperForConditionalGeneration", whisper, features, asr),
    ]  # fmt: skip


def _xt_heldout() -> list[Case]:
    """x-transformers' own wrappers from small configs: a decoder-only LM with rotary position
    embeddings trained by the package's ``AutoregressiveWrapper`` (its next-token loss), and an
    encoder with GLU feed-forwards, RMSNorm, T5's relative position bias and memory key/values,
    mean-pooled into a 3-class head (the head the only code written here)."""
    xt = _import_or_skip("x_transformers", XT_MODELS, "x-transformers")
    if xt is None:
        return []
    import torch
    from torch import nn

    V, L, ids = HF_VOCAB, HF_LEN, hf_ids

    def decoder() -> Any:
        net = xt.TransformerWrapper(
            num_tokens=V, max_seq_len=L,
            attn_layers=xt.Decoder(dim=64, depth=2, heads=4, rotary_pos_emb=True),
        )  # fmt: skip
        return xt.AutoregressiveWrapper(net)

    def tied() -> Any:
        # One attention block and one feed-forward, their weights tied across 4 layers: the same
        # modules called 4 times a step (x-transformers' ``weight_tie_layers``)
        net = xt.TransformerWrapper(
            num_tokens=V, max_seq_len=L,
            attn_layers=xt.Decoder(dim=64, depth=4, heads=4, weight_tie_layers=True, rotary_pos_emb=True),
        )  # fmt: skip
        return xt.AutoregressiveWrapper(net)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = xt.TransformerWrapper(
                num_tokens=V, max_seq_len=L, return_only_embed=True,
                attn_layers=xt.Encoder(
                    dim=64, depth=2, heads=4, ff_glu=True, use_rmsnorm=True, rel_pos_bias=True,
                    attn_num_mem_kv=4,
                ),
            )  # fmt: skip
            self.head = nn.Linear(64, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(x).mean(1))

    def lm(m: Any, x: Any, y: Any) -> Any:
        return m(x)

    def cls(m: Any, x: Any, y: Any) -> Any:
        return nn.functional.cross_entropy(m(x), y)

    return [
        Case(
            "xt-decoder",
            "x_transformers.TransformerWrapper(Decoder, rotary) + AutoregressiveWrapper",
            decoder,
            ids,
            lm,
        ),
        Case(
            "xt-encoder",
            "x_transformers.TransformerWrapper(Encoder, glu/rmsnorm/rel-pos/mem-kv)",
            Classifier,
            ids,
            cls,
        ),
        Case(
            "xt-tied",
            "x_transformers.TransformerWrapper(Decoder, weight_tie_layers) + AutoregressiveWrapper",
            tied,
            ids,
            lm,
        ),
    ]


def _khub_heldout() -> list[Case]:
    """keras-hub's GPT-2 causal LM and BERT text classifier from 2-layer configs (no presets, no
    weights, no preprocessor): the models take keras-hub's dict of token ids and padding mask
    (and segment ids for BERT), as their own ``fit`` would be given."""
    kh = _import_or_skip("keras_hub", KHUB_MODELS, "keras-hub")  # (it imports TensorFlow)
    if kh is None:
        return []
    import keras
    import tensorflow as tf

    V, B, L = HF_VOCAB, HF_BATCH, HF_LEN
    size: dict[str, Any] = dict(
        vocabulary_size=V, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128,
        max_sequence_length=L, dropout=0.0,
    )  # fmt: skip

    def gpt2() -> Any:
        return kh.models.GPT2CausalLM(backbone=kh.models.GPT2Backbone(**size), preprocessor=None)

    def bert() -> Any:
        backbone = kh.models.BertBackbone(**size)
        return kh.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0)

    def tokens(g: Any) -> Any:
        return g.uniform((B, L), 0, V, dtype=tf.int32)

    def lm_batch() -> tuple[Any, ...]:
        g = tf.random.Generator.from_seed(6)
        x = tokens(g)  # the labels: the next token (the last one wraps around)
        return {"token_ids": x, "padding_mask": tf.ones((B, L), tf.int32)}, tf.roll(x, -1, axis=1)

    def cls_batch() -> tuple[Any, ...]:
        g = tf.random.Generator.from_seed(7)
        x = {
            "token_ids": tokens(g),
            "padding_mask": tf.ones((B, L), tf.int32),
            "segment_ids": tf.zeros((B, L), tf.int32),
        }
        return x, g.uniform((B,), 0, 3, dtype=tf.int32)

    def ce(out: Any, y: Any) -> Any:
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))

    return [
        Case("khub-gpt2", "keras_hub.models.GPT2CausalLM", gpt2, lm_batch, ce, "tensorflow"),
        Case("khub-bert", "keras_hub.models.BertTextClassifier", bert, cls_batch, ce, "tensorflow"),
    ]


def _timm_heldout() -> list[Case]:
    """timm's image models as ``timm.create_model`` builds them (no weights, 10 classes, the
    package's default drop rates), a batch of 8 random images, cross-entropy: convolution
    networks with squeeze-excitation, ghost modules, depthwise 7x7 blocks with LayerNorm, a deep
    stem, a ViT, and MobileViT's unfolded attention. timm imports torchvision (CUDA builds only on
    this machine's index, imported as ``import_torchvision`` does)."""
    try:
        import_torchvision()
    except Exception as exc:  # noqa: BLE001 - not installed, or failing as it imports
        why = f"torchvision is not importable ({type(exc).__name__}: {exc}); pip install timm torchvision"
        SKIPPED.update(dict.fromkeys(TIMM_MODELS, why))
        return []
    timm = _import_or_skip("timm", TIMM_MODELS, "timm")
    if timm is None:
        return []
    import torch
    from torch import nn

    def case(name: str) -> Case:
        model, side, options = TIMM[name]

        def make() -> Any:
            return timm.create_model(model, pretrained=False, num_classes=10, **options)

        def images() -> tuple[Any, ...]:
            g = torch.Generator().manual_seed(5)
            return torch.randn(8, 3, side, side, generator=g), torch.randint(0, 10, (8,), generator=g)

        def ce(m: Any, x: Any, y: Any) -> Any:
            return nn.functional.cross_entropy(m(x), y)

        return Case(name, f"timm.create_model({model!r}) at {side}x{side}", make, images, ce)

    return [case(name) for name in TIMM_MODELS]


def main(argv: list[str] | None = None) -> int:
    from .compiler import main as bench

    return bench(["--corpus", "heldout", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
