"""Pretrain Megatron BERT with sequence-parallel attention; run it through the deepspeed launcher:

    deepspeed --num_gpus 2 pretrain_bert.py --deepspeed --deepspeed_config ds_configs/ring_sp2.json \
        --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 256 --train-iters 300
"""
from megatron.parallel import launcher_watch
from megatron.quiet import quiet_deepspeed

launcher_watch.note_launchers()  # first: a launcher that ends during the imports below is still noticed
quiet_deepspeed()  # before DeepSpeed is first imported (megatron.training imports it)
from megatron.training import exit_rank, main  # noqa: E402

if __name__ == "__main__":
    exit_rank(main())  # without the interpreter's teardown (see exit_rank); a traceback still ends as usual
