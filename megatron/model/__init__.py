"""BERT model (bert.py), its attention cores (attention/) and loss (loss.py)."""
