"""The words of the lines that say how a stopped or failed run goes on: the trainer's own flags
(`--load SAVE`), or, for a run a tool launched (`--launched-by extend_context.py`, which the tool
passes on the command line every rank gets, over ssh too), that tool's command: it restates the
layout and model flags that `pretrain_bert.py --load SAVE` alone does not take from a checkpoint
(which would resume at SP 1, with dense attention and unpacked samples)."""


def resume_fix(args, save: str) -> str:
    """'resume with --load SAVE', or 'rerun the same TOOL command' (the tool resumes from its --save)."""
    if args.launched_by:
        return f"rerun the same {args.launched_by} command"
    return f"resume with --load {save}"


def held_out_fix(args, save: str, losses: str) -> str:
    """How the held-out `losses` ("the test loss", ...) of a run stopped after its last step, before its final
    evaluations, are computed: a rerun with --load resumes at the run's length and evaluates; the tool does not
    launch a run already at its length (training.finished_resume), so there they come at the end of a longer run."""
    if args.launched_by:
        flag = "--train-iters" if args.train_iters else "--train-samples"
        return (f"{losses} come{'s' * losses.endswith('loss')} at the end of a run that trains: rerun the same "
                f"{args.launched_by} command with a larger {flag} to go on")
    return f"rerun with --load {save} to compute {losses}"


def new_run_fix(args, folder: str) -> str:
    """The command of a new run from the weights of the checkpoint folder `folder` at a lower rate, into
    another --save (a resume keeps the checkpoint's peak --lr). A tool's run: its command from that
    folder at the same length (extend_context.py keeps a checkpoint's theta at 1x). `args` None: the
    trainer's."""
    if args is not None and args.launched_by:
        return f"{args.launched_by} --from {folder} --seq-length {args.seq_length} --save ANOTHER_DIR -- ... --lr LOWER"
    return f"--finetune --load {folder} --lr LOWER --save ANOTHER_DIR"
