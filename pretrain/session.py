"""A pre-training run's hold on its files (Chen et al., ICLR 2023, Appendix A.2 runs, made safe to resume):
whether it resumes, the locks on --out and the run directory, its start or the state it continues from, and
the check that every torchrun rank sees the same run directory.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from fpsfl.base.checkpoint import differences, plain
from fpsfl.base.rundir import RunDir, RunDirError, lock_out
from fpsfl.base.settings import typed_table

from . import distributed
from .recipe import RunOptions, typed_method_args

# what a resumed run must share with the saved one: the method's settings and the data (the bank's or image
# list's hash, the steps an epoch) that the same paths may no longer hold; and the recipe, the ``pretrain``
# table, which :func:`check_recipe` compares with its method settings typed
RESUME_COMPARE = ("method", "steps_per_epoch", "data")


def lock_run(run: RunDir, mode: str, opts: RunOptions, stack: ExitStack) -> bool:
    """Rank 0, before anything is built: decide whether the run resumes (``--resume auto``: if the run
    directory holds a run), hold --out's lock and refuse an existing --out for a new run, hold the run
    directory's lock."""
    resume = (run.has_state() or run.config_path.is_file()) if mode == "auto" else mode == "yes"
    for locked in (False, True):  # checked before the lock too, so that a refusal touches no file
        if locked:
            stack.enter_context(lock_out(Path(opts.out), out_names(Path(opts.out))))
        if not resume and Path(opts.out).exists():
            held = (f"{run.path} holds no training state" if mode == "auto" else
                    "pass --resume to continue its run")
            raise RunDirError(f"--out {opts.out} already exists and is not overwritten; {held}, or choose "
                              f"another --out")
    if not resume:
        stack.push(_undo_out(run, Path(opts.out)))  # runs after the session's own clean-up (LIFO)
    stack.enter_context(run.session(resume))
    return resume


def _undo_out(run: RunDir, out: Path):
    """A new run that fails before its first state (a full disk while writing it, say) removes its run
    directory (:meth:`RunDir.session`); it must take the --out and --keep-every files it wrote with it, or
    they block the next attempt ("exists, pass --resume") while --resume finds no state (issue 42)."""
    names = out_names(out)
    folder = out.parent
    before = {p.name for p in folder.iterdir() if names.fullmatch(p.name)} if folder.is_dir() else set()

    def undo(exc_type, exc, tb) -> bool:
        if exc_type is not None and not run.has_state() and out.parent.is_dir():
            for path in out.parent.iterdir():
                if names.fullmatch(path.name) and path.name not in before:
                    path.unlink(missing_ok=True)
        return False  # the error goes on
    return undo


# the files --out's lock guards: --out and its --keep-every copies (kept_path)
def out_names(out: Path) -> re.Pattern:
    return re.compile(f"{re.escape(out.name)}|{re.escape(out.stem)}\\.e\\d{{4,}}{re.escape(out.suffix)}")


def start_run(run: RunDir, resume: bool, opts: RunOptions, config: dict, world: int) -> dict | None:
    """Rank 0: create the run, or load (and check) the state it resumes from; a run killed before its
    first state is started again."""
    if resume:
        check_recipe(run, config["pretrain"])
    if resume and run.has_state():
        return run.load_state(config, compare=RESUME_COMPARE)
    if resume:
        run.start_again(config, compare=RESUME_COMPARE)
    run.create(config, {**asdict(opts), "world_size": world} if world > 1 else opts)
    return None


def check_recipe(run: RunDir, table: dict) -> None:
    """``--resume``: the run's ``pretrain`` table (``table``, this command's) must be the saved one. Method
    settings compare as the method types them: runs before issue 38's fix recorded ``--set temperature=0.5``
    as the text "0.5", and the short recipe gives the number. A mismatch names each differing setting."""
    saved = run.saved_config().get("pretrain")
    if not isinstance(saved, dict):  # a record without one: the other checks decide
        return
    differs = [f"{k}: {a!r} there, {b!r} here" for k, a, b in differences(_typed(saved), plain(table))]
    if differs:
        raise RunDirError(f"--resume: the pretrain config differs from the one in {run.config_path} "
                          f"({'; '.join(differs)}); resume with the same settings or start a new run")


def _typed(table: dict) -> dict:
    """A saved ``pretrain`` table with its method settings typed (as they were when it ran, if this code
    cannot type them: a renamed setting then differs, as it should)."""
    return plain(typed_table(table, "method", "method_args", typed_method_args))


def check_shared(run: RunDir, d: distributed.Dist) -> None:
    """Every rank must see rank 0's config.json: a torchrun restart may move rank 0 to another node, which
    then resumes only from storage every node sees. A mismatch is one line on every rank."""
    if d.world == 1:
        return
    path = run.config_path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else "no file"
    digests = distributed.gather(d, digest)
    others = [f"rank {r}: {h}" for r, h in enumerate(digests) if h != digests[0]]
    if others:
        raise RunDirError(f"{path} differs between ranks (rank 0: {digests[0]}; {', '.join(others[:3])}); "
                          f"put --run-dir on storage that every node sees")
