"""A tiny llama-architecture GGUF model with random weights, for running a
real engine (llama.cpp) in tests and ``bench/`` without downloading one.

The vocabulary is llama.cpp's own ``ggml-vocab-llama-spm.gguf`` (the
SentencePiece llama vocabulary: tokens, scores, token types, BOS and EOS),
which ships in the llama-cpp-python sdist; ``make llama-engine`` extracts it
into the wheel cache and exports its path as ``IOP_LLAMA_VOCAB``.

Random weights would sample any token, and two kinds must never come out:

* byte-fallback tokens (``<0x00>``..``<0xFF>``): a lone one is an incomplete
  UTF-8 sequence, and llama-cpp-python's streaming detokenizer holds text
  back until the sequence completes, so a stream stalls for seconds;
* EOS (and the other control tokens): a completion would often stop after a
  token or two, and tests want as many tokens as they ask for.

So hidden dimension 0 is made constant and positive: every token embedding
holds :data:`_MARKER` there, no attention or feed-forward output writes to
it, and the RMS norm keeps it positive. The output rows of the tokens that
must not be sampled hold a large negative weight in that dimension and the
others zero, so their logits sit thousands below every other token's under
any prompt, whatever the sampler's temperature, top-k or top-p.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

#: Where ``make llama-engine`` puts the vocabulary unless ``IOP_LLAMA_VOCAB`` says otherwise.
DEFAULT_VOCAB_PATH = Path.home() / ".cache" / "twisted-iop" / "ggml-vocab-llama-spm.gguf"

#: The value of the constant hidden dimension in every token embedding.
_MARKER = 1.0
#: The output weight in that dimension of a token that must never be sampled.
_NEVER = -4000.0
#: llama.cpp's token type of an ordinary token (gguf.TokenType.NORMAL).
_NORMAL_TOKEN = 1


@attrs.frozen
class TinyModelShape:
    """The dimensions of a tiny model; the defaults write a file of about 17 MB."""

    layers: int = 2
    embedding: int = 64
    heads: int = 4
    feed_forward: int = 128
    context: int = 512
    seed: int = 17

    def describe(self) -> str:
        """One line for a benchmark's settings."""
        return (
            f"llama arch, {self.layers} layers, embedding {self.embedding}, {self.heads} heads, "
            f"ff {self.feed_forward}, trained context {self.context}, random weights (seed {self.seed})"
        )


def vocabulary_path() -> Path:
    """The llama SPM vocabulary: ``$IOP_LLAMA_VOCAB`` or :data:`DEFAULT_VOCAB_PATH`.

    Raises ``FileNotFoundError`` naming ``make llama-engine`` when it is not there.
    """
    path = Path(os.environ.get("IOP_LLAMA_VOCAB") or DEFAULT_VOCAB_PATH)
    if not path.is_file():
        raise FileNotFoundError(f"llama vocabulary {path} is missing: `make llama-engine` extracts it")
    return path


def write_tiny_model(path: Path, shape: TinyModelShape = TinyModelShape(), vocab: Path | None = None) -> Path:
    """Write a tiny llama GGUF with random weights (deterministic for ``shape.seed``) to ``path``.

    Written to a temporary name and renamed, so a reader never sees half a
    file. Returns ``path``.
    """
    import gguf  # a test extra, with numpy
    import numpy as np

    reader = gguf.GGUFReader(str(vocab or vocabulary_path()))
    tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]
    scores = [float(s) for s in reader.fields["tokenizer.ggml.scores"].contents()]
    token_types = [int(t) for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    vocab_size = len(tokens)

    rng = np.random.default_rng(shape.seed)
    n, ff, head_dim = shape.embedding, shape.feed_forward, shape.embedding // shape.heads

    def matrix(rows: int, columns: int, scale: float = 0.02) -> Any:
        return (rng.standard_normal((rows, columns)) * scale).astype(np.float32)

    def ones(size: int) -> Any:
        return np.ones(size, dtype=np.float32)

    embeddings = matrix(vocab_size, n, 1.0)
    embeddings[:, 0] = _MARKER
    output = matrix(vocab_size, n, 1.0)
    output[:, 0] = 0.0
    never = np.array([t != _NORMAL_TOKEN for t in token_types])
    output[never, 0] = _NEVER

    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("iop-tiny-llama")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(n)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    for key, add in (
        ("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
        ("tokenizer.ggml.unknown_token_id", writer.add_unk_token_id),
    ):
        add(int(reader.fields[key].contents()))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", ones(n))
    writer.add_tensor("output.weight", output)
    for layer in range(shape.layers):
        attention_out, down = matrix(n, n), matrix(n, ff)
        # Nothing writes to the constant dimension of the residual stream.
        attention_out[0, :] = 0.0
        down[0, :] = 0.0
        for name, tensor in (
            ("attn_norm.weight", ones(n)),
            ("attn_q.weight", matrix(n, n)),
            ("attn_k.weight", matrix(n, n)),
            ("attn_v.weight", matrix(n, n)),
            ("attn_output.weight", attention_out),
            ("ffn_norm.weight", ones(n)),
            ("ffn_gate.weight", matrix(ff, n)),
            ("ffn_up.weight", matrix(ff, n)),
            ("ffn_down.weight", down),
        ):
            writer.add_tensor(f"blk.{layer}.{name}", tensor)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def tiny_model(directory: Path, shape: TinyModelShape = TinyModelShape()) -> Path:
    """The tiny model of ``shape`` in ``directory``, written there the first time."""
    path = directory / f"iop-tiny-llama-{shape.layers}x{shape.embedding}-ctx{shape.context}-s{shape.seed}.gguf"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        write_tiny_model(path, shape)
    return path
