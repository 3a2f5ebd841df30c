"""--whole-word-masking: the flag reaches the train, valid and test BertDatasets that pretrain
builds (the masking itself: tests/test_data_bert.py)."""
from types import SimpleNamespace

import pytest

from megatron.arguments import build_parser
from megatron.parallel.spawn import run_on_ranks
from megatron.training import sample_options
from test_data_bert import write_corpus, write_vocab


class DatasetsBuilt(Exception):
    """Stops pretrain once its datasets exist, before the engine is built."""


def datasets_of_pretrain(argvs: list) -> list:
    """Per argv, (split name, whole-word masking on) of every BertDataset `pretrain` builds."""
    import megatron.training as training
    from megatron.data import bert_dataset

    built = []
    init = bert_dataset.BertDataset.__init__

    def recording_init(self, name, *args, **kwargs):
        init(self, name, *args, **kwargs)
        built[-1].append((name, self.continuation is not None))

    def stop(*args, **kwargs):
        raise DatasetsBuilt

    bert_dataset.BertDataset.__init__ = recording_init
    training.build_engine = stop
    for argv in argvs:
        built.append([])
        with pytest.raises(DatasetsBuilt):
            training.pretrain(build_parser().parse_args(argv))
    return built


def test_flag_sets_the_sample_options():
    binary_head = SimpleNamespace(model=SimpleNamespace(add_binary_head=True, max_segment_length=None),
                                  pack_samples=False)
    assert sample_options(build_parser().parse_args([]), binary_head)["whole_word_masking"] is False
    options = sample_options(build_parser().parse_args(["--whole-word-masking", "--mask-prob", "0.2"]), binary_head)
    assert options == dict(masked_lm_prob=0.2, seed=1234, binary_head=True, whole_word_masking=True,
                           pack_samples=False, max_segment_length=None)
    assert "WordPiece pieces of a word" in build_parser().format_help()


def test_flag_reaches_the_train_valid_and_test_datasets(tmp_path):
    prefix, vocab = write_corpus(tmp_path / "corpus", num_docs=120), write_vocab(tmp_path)
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--train-iters", "2", "--eval-iters", "1",
            "--split", "80,10,10", "--data-path", prefix, "--vocab-file", str(vocab.file)]
    with_flag, without = run_on_ranks(datasets_of_pretrain, 1, [[*argv, "--whole-word-masking"], argv], timeout=120)[0]
    assert with_flag == [("train", True), ("valid", True), ("test", True)]
    assert without == [("train", False), ("valid", False), ("test", False)]
