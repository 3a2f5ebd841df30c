"""Start-up checks of the attention registry: each bad setting is a one-line error with a fix."""
import pytest

from bert_fixtures import small_config
from megatron.errors import ConfigError
from megatron.model import attention


@pytest.mark.parametrize("variant,size,overrides,message", [
    ("linformer", 5, dict(linformer_k=8), "seq_length 48 is not divisible by the sequence-parallel size 5"),
    ("ulysses", 3, {}, "ulysses needs num_attention_heads (4) divisible by the sequence-parallel size (3)"),
    ("ulysses", 5, {}, "ulysses needs num_attention_heads (4) divisible by the sequence-parallel size (5)"),
    ("hybrid", 6, dict(ulysses_size=4), "ulysses_size 4 does not divide the sequence-parallel size 6"),
    ("dense", 2, {}, "attention 'dense' sees only the local chunk"),
    ("ring", 2, dict(attention_dropout=0.1), "attention_dropout 0.1 is not supported by ring attention"),
    ("flash", 1, {}, "unknown attention variant 'flash'; choose one of: bigbird, dense, hybrid, linformer, ring, ulysses"),
])
def test_bad_attention_settings(variant, size, overrides, message):
    config = small_config(variant, **overrides)
    with pytest.raises(ConfigError) as error:
        attention.check(config, size)
    text = str(error.value)
    assert message in text and "\n" not in text and "; " in text


def test_ulysses_over_heads_the_size_does_not_divide_leads_with_what_keeps_the_model():
    """The heads of weights a run starts from are fixed (--init-from-hf, --load: was 'choose a head count'
    first): the fix leads with the ways that keep them, each of which passes; a new head count comes
    last, for a model from scratch."""
    heads = dict(num_attention_heads=6, hidden_size=48)
    with pytest.raises(ConfigError) as error:
        attention.check(small_config("ulysses", **heads), 4)
    assert error.value.fix == (
        "use --attention ring, or --attention hybrid --ulysses-size 2 (Ulysses inside groups of 2 ranks, a divisor "
        "of the heads and the size, a ring across them), or a --sequence-parallel-size that divides the 6 heads "
        "(2, 3 or 6) and the ranks, or for a model from scratch, a head count that is a multiple of 4")
    attention.check(small_config("ring", **heads), 4)
    attention.check(small_config("hybrid", ulysses_size=2, **heads), 4)
    for size in (2, 3, 6):
        attention.check(small_config("ulysses", **heads), size)
    with pytest.raises(ConfigError) as error:  # no divisor of both: hybrid would be a ring, not named
        attention.check(small_config("ulysses", **heads), 5)
    assert "hybrid" not in error.value.fix and error.value.fix.startswith("use --attention ring, or a ")
    with pytest.raises(ConfigError) as error:  # 3 heads: it named 'a size that divides the 3 heads (3)'
        attention.check(small_config("ulysses", num_attention_heads=3, hidden_size=48), 2)
    assert error.value.fix == ("use --attention ring, or --sequence-parallel-size 3 (the 3 heads' only divisor) on a "
                               "multiple of 3 ranks, or for a model from scratch, a head count that is a multiple of 2")


def test_weights_a_run_starts_from_keep_their_head_count_in_the_fix():
    """extend_context.py (and a run from --init-from-hf or --load) proposed a new head count "for a model from
    scratch" for weights that fix it: config.resolve(weights_given=True) leaves that way out."""
    from megatron.config import resolve

    flags = dict(num_layers=2, hidden_size=48, num_attention_heads=6, seq_length=64, max_position_embeddings=64,
                 attention="ulysses", sequence_parallel_size=4)
    for weights_given, last in ((False, "or for a model from scratch, a head count that is a multiple of 4"),
                                (True, "that divides the 6 heads (2, 3 or 6) and the ranks")):
        with pytest.raises(ConfigError) as error:
            resolve(flags, {"train_micro_batch_size_per_gpu": 1}, 4, deepspeed_check=False, weights_given=weights_given)
        assert error.value.fix.endswith(last), error.value.fix


@pytest.mark.parametrize("variant,size", [("ring", 3), ("ring", 4), ("ulysses", 4), ("dense", 1), ("ring", 5),
                                          ("hybrid", 6)])  # ring 5: 48 tokens padded to 50
def test_valid_settings_pass(variant, size):
    attention.check(small_config(variant), size)


def test_every_core_has_its_start_up_rules():
    """rules.py (torch-free, read by megatron.config and tools/ds_config.py) knows exactly the cores
    a run can choose; "local", the core of local sliding-window layers, is checked by rules.check
    with the configured variant (test_local_attention.py)."""
    assert sorted(set(attention.VARIANTS) - {"local"}) == sorted(attention.RULES)
