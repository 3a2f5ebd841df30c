"""Pretrain Megatron BERT with sequence-parallel attention; run it through the deepspeed launcher:

    deepspeed --num_gpus 2 pretrain_bert.py --deepspeed --deepspeed_config ds_configs/ring_sp2.json \
        --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 256 --train-iters 300
"""
import signal
import sys
import traceback

from megatron.arguments import launcher_rank
from megatron.errors import Interrupted, raise_on_signals, restore_signals, stopped_during_start_up, survive_lost_terminal
from megatron.parallel import launcher_watch
from megatron.quiet import quiet_deepspeed

launcher_watch.note_launchers()  # first: a launcher that ends during the imports below is still noticed
survive_lost_terminal()  # before DeepSpeed's logger keeps sys.stdout: a closed terminal does not end the run
importing = raise_on_signals()  # Ctrl-C during the seconds of imports below: one line, not a traceback
try:
    quiet_deepspeed()  # before DeepSpeed is first imported (megatron.training imports it)
    from megatron.training import exit_rank, main
except Interrupted as error:
    if launcher_rank() == 0:
        print(stopped_during_start_up(error.signum), file=sys.stderr, flush=True)
    sys.exit(128 + error.signum)
restore_signals(importing)  # main installs its own

if __name__ == "__main__":  # every way out goes through exit_rank, which skips the interpreter's teardown
    try:
        code = main()
    except KeyboardInterrupt:  # --debug's stop during start-up, shown where it happened
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except Exception:  # --debug, or an error no check foresaw: its traceback, as Python prints it
        traceback.print_exc()
        code = 1
    exit_rank(code)
