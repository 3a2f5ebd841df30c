"""Pretrain Megatron BERT with sequence-parallel attention; run it through the deepspeed launcher:

    deepspeed --num_gpus 2 pretrain_bert.py --deepspeed --deepspeed_config ds_configs/ring_sp2.json \
        --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 256 --train-iters 300
"""
from megatron.held_signals import hold_stop_signals
hold_stop_signals()  # first: Ctrl-C as the ranks spawn, during the imports below, is the start-up's one line

import signal
import sys
import traceback

from megatron.parallel.launch_env import launcher_rank
from megatron.errors import BEFORE_THE_FIRST_STEP, start_up_stops_in_one_line, survive_lost_terminal
from megatron.parallel import launcher_watch, master_address
from megatron.data.workers import warn_cpu_oversubscription
from megatron.paths import expand_home
from megatron.quiet import quiet_deepspeed

launcher_watch.note_launchers()  # first: a launcher that ends during the imports below is still noticed
survive_lost_terminal()  # before DeepSpeed's logger keeps sys.stdout: a closed terminal does not end the run
master_address.exit_if_unusable("pretrain_bert.py")  # before the imports: an address the rendezvous cannot use
with start_up_stops_in_one_line("pretrain_bert.py", BEFORE_THE_FIRST_STEP, tell=launcher_rank() == 0):
    # Ctrl-C during the seconds of imports: one line, not a traceback
    quiet_deepspeed(on_the_device=True)  # before DeepSpeed is first imported (megatron.training imports it)
    warn_cpu_oversubscription()  # CPU ranks or threads beyond the CPUs: one warning line
    from megatron.training import exit_rank, main

if __name__ == "__main__":  # every way out goes through exit_rank, which skips the interpreter's teardown
    sys.argv[1:] = expand_home(sys.argv[1:])  # `--save=~/ck`: bash leaves that ~ as typed
    try:
        code = main()
    except KeyboardInterrupt:  # --debug's stop during start-up, shown where it happened
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except Exception:  # --debug, or an error no check foresaw: its traceback, as Python prints it
        traceback.print_exc()
        code = 1
    exit_rank(code)
