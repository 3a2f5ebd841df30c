"""Process topology (pipe x data x seq) and the collectives applied from outside the model."""
