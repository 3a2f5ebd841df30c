"""Data pipeline: tokenizers, Megatron indexed datasets, C++ sample helpers, BERT samples."""
