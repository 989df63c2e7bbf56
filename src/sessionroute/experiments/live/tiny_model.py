"""A tiny random-weight chat model that real vLLM can serve on a CPU, made without any hub.

``shared/REAL_VLLM.md``: a ``LlamaForCausalLM`` with hidden size 128, 2 layers, 2 heads, a
2048-token vocabulary and 4096 positions in float32 (random weights, seeded), and a byte-level
BPE tokenizer trained here with ``tokenizers`` on text made of the live driver's prompt words
(:data:`sessionroute.experiments.live.text.WORDS`, so each space-led word is one token),
wrapped as a ``PreTrainedTokenizerFast`` with the emulator's chat template
(``<|role|>\\n...<|end|>\\n``,
generation prompt ``<|assistant|>\\n``). Saved with ``save_pretrained``; about 2 MB, 10 s.

Needs ``torch``, ``transformers`` and ``tokenizers`` (the vLLM venv has them). Run it with that
interpreter (``$VENV/bin/python -m sessionroute.experiments.live.tiny_model DIR``, ``src/`` on
its path), or through ``sessionroute tiny-model DIR --python $VENV/bin/python``. Output text is
gibberish; lengths are forced by requests (``max_tokens`` + ``ignore_eos``). The weights let the
model generate only space-led whole words (:func:`reply_token_ids`), so its replies decode to
text that re-tokenises to the generated ids: a live conversation repeats each reply token for
token, as the simulator assumes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sessionroute.experiments.live.text import WORDS

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "can_build_here",
    "main",
    "reply_token_ids",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The emulator's template (:func:`sessionroute.emulate.render_chat`) in Jinja."""

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|end|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|tool|>",
    "<|pad|>",
)
"""Special tokens of the tokenizer (``<|end|>`` is also the EOS token)."""

_NEEDS = ("torch", "transformers", "tokenizers")


def can_build_here() -> bool:
    """True when this interpreter has ``torch``, ``transformers`` and ``tokenizers``."""
    return all(importlib.util.find_spec(m) is not None for m in _NEEDS)


def _corpus(rng: random.Random, lines: int) -> Iterator[str]:
    punctuation = ("", "", "", ",", ".", ":")
    for _ in range(lines):
        n = rng.randint(8, 64)
        words = [rng.choice(WORDS) + rng.choice(punctuation) for _ in range(n)]
        yield " ".join(words) + "\n"


def build_tiny_model(
    out_dir: str | Path, *, seed: int = 0, vocab_size: int = 2048, corpus_lines: int = 20000
) -> Path:
    """Train the tokenizer, make the random model, and save both into ``out_dir``.

    Args:
        out_dir: directory to write (created; files in it are overwritten).
        seed: seeds the corpus and the weights.
        vocab_size: BPE vocabulary size (the model's vocabulary).
        corpus_lines: lines of generated training text.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ImportError: ``torch``, ``transformers`` or ``tokenizers`` is missing.
    """
    # imported by name: these live in vLLM's venv, not ours (no stubs to check against)
    torch: Any = importlib.import_module("torch")
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")
    decoders, models, pre_tokenizers, trainers = (
        tk.decoders,
        tk.models,
        tk.pre_tokenizers,
        tk.trainers,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    bpe = tk.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(rng, corpus_lines), trainer)
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|end|>", "<|pad|>")],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
    torch.manual_seed(seed)
    eos = int(tokenizer.convert_tokens_to_ids("<|end|>"))
    pad = int(tokenizer.convert_tokens_to_ids("<|pad|>"))
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = tf.LlamaForCausalLM(config).to(torch.float32)
    allowed = reply_token_ids(tokenizer.get_vocab())
    with torch.no_grad():
        _restrict_outputs(model, allowed)
    model.save_pretrained(str(out))
    (out / "sessionroute_tiny_model.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "vocab_size": len(tokenizer),
                "words": len(WORDS),
                "reply_token_ids": len(allowed),
            }
        )
        + "\n",
        encoding="utf-8",
    )
    return out


def reply_token_ids(vocab: dict[str, int]) -> list[int]:
    """The ids the model may generate: each of :data:`WORDS` led by a space (the byte-level
    BPE's ``"Ġ" + word``), sorted.

    A reply made of them decodes to `` w1 w2 ...`` and re-tokenises to the same ids inside the
    next prompt's history (after the template's ``<|assistant|>\\n``), so a live multi-turn
    conversation repeats its replies token for token, as the simulator's ``reply_reuse = 1``
    assumes. Any other id (special tokens, bare bytes, sub-word pieces, punctuation) may not
    survive detokenisation: measured before this restriction, the next prompt carried 3-4 %
    more, different tokens.

    Raises:
        ValueError: when a word is not one token of the vocabulary (the tokenizer was trained
            on other text).
    """
    missing = [w for w in WORDS if "\u0120" + w not in vocab]
    if missing:
        raise ValueError(f"words that are not one space-led token: {missing[:5]}")
    return sorted(vocab["\u0120" + w] for w in WORDS)


_BLOCKED_LOGIT = 100.0  # logit penalty per unit of the constant channel (its value: 1 / rms)


def _restrict_outputs(model: Any, allowed: Sequence[int]) -> None:
    """Make every id outside ``allowed`` lose every argmax, in the weights themselves (the
    OpenAI API has no logits processor and ``lm_head`` has no bias).

    Hidden dimension 0 becomes a constant channel: the embedding writes 1.0 there for every
    token, no layer reads it (its input norms' weight 0) or writes it (row 0 of ``o_proj``
    and ``down_proj`` zeroed), so after the final RMSNorm it holds ``1 / rms(x) > 0`` at every
    position; ``lm_head``'s column 0 is 0 for allowed ids and ``-100`` for the others, a
    penalty of hundreds of logits against the random logits' spread of about 1.
    """
    inner = model.model
    inner.embed_tokens.weight[:, 0] = 1.0
    for layer in inner.layers:
        layer.input_layernorm.weight[0] = 0.0
        layer.post_attention_layernorm.weight[0] = 0.0
        layer.self_attn.o_proj.weight[0, :] = 0.0
        layer.mlp.down_proj.weight[0, :] = 0.0
    inner.norm.weight[0] = 1.0
    head = model.lm_head.weight
    head[:, 0] = -_BLOCKED_LOGIT
    head[list(allowed), 0] = 0.0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sessionroute.experiments.live.tiny_model DIR [--seed N]``; returns the exit
    status."""
    parser = argparse.ArgumentParser(prog="python -m sessionroute.experiments.live.tiny_model")
    parser.add_argument("dir", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of corpus and weights")
    args = parser.parse_args(argv)
    if not can_build_here():
        missing = [m for m in _NEEDS if importlib.util.find_spec(m) is None]
        print(f"error: this interpreter lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    path = build_tiny_model(args.dir, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
