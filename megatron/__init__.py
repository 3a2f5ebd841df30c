"""Megatron BERT with sequence-parallel attention, trained through DeepSpeed."""
