"""Held-out models for the compiler's public-corpus runner (issue 18): public models that are not
in the corpus (``transformers``' LlamaForCausalLM, DistilBertForSequenceClassification and
BartForConditionalGeneration from tiny configs, no weights), measured by the same runner as the
corpus (``compiler_corpus.bench_case``): eager, ``torch.compile`` and microco per run length
(300, 1,000, 5,000), each a first run on this machine told that length, then all interleaved
with an A/A control (a second eager instance; the rounds' orders balanced so that each runs
after each other equally often; medians of wall and of process CPU time per step); each run
length's total is a contender's measured first steps (compile, exploration, a warm-up step)
plus the remaining steps at its interleaved median (the JSON's ``totals``).

``microco bench compiler --corpus heldout [--models hf-llama,hf-distilbert,hf-bart] --json``,
or ``python -m microco.benchmarks.compiler_heldout [the same options]``.
"""

from __future__ import annotations

import sys
from typing import Any

from .compiler_corpus import HF_LEN, HF_VOCAB, Case, hf_ids, transformers_or_skip

MODELS = ("hf-llama", "hf-distilbert", "hf-bart")


def heldout() -> list[Case]:
    tr = transformers_or_skip(MODELS)
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


def main(argv: list[str] | None = None) -> int:
    from .compiler import main as bench

    return bench(["--corpus", "heldout", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
