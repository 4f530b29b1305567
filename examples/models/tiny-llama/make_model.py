"""Make a tiny Llama-architecture model here, with no model hub: a byte-level BPE
tokenizer trained on local text, a chat template, and random weights (2 layers, hidden
256: about 2M parameters, a few MB). The text it writes is noise, but everything an
engine does with it is real: tokenizer, chat template, KV cache, prefix cache, batching.

Run it with an interpreter that has `tokenizers`, `transformers` and `torch` (the vLLM
engine env has them all):

    python examples/models/tiny-llama/make_model.py OUT_DIR [--vocab 2000] [--seed 0]

then push OUT_DIR as a model artifact (`aicluster artifacts push OUT_DIR default/tiny-llama`)
and serve it (examples/services/vllm-tiny.yaml).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Local text to train the tokenizer on: this repository's docs, else the Python
    standard library's sources (both always present where this script runs)."""
    root = HERE.parents[2]
    files = sorted(root.glob("*.md")) + sorted((root / "docs").glob("*.md"))
    if not files:
        import json as stdlib_module

        files = sorted(Path(stdlib_module.__file__).parent.parent.glob("*.py"))[:50]
    return [f.read_text(errors="replace") for f in files]


def make(out: Path, vocab: int = 2000, seed: int = 0, max_positions: int = 1024) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny-llama: {params / 1e6:.1f}M parameters, vocab {len(fast)}, saved to {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-positions", type=int, default=1024, help="longest sequence, tokens")
    args = p.parse_args(argv)
    make(args.out, args.vocab, args.seed, args.max_positions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
