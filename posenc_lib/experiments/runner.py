"""The experiments' one grid loop: cells, resume, worker processes, result files, and the command line they share.

An experiment is a grid of :class:`Cell` s, one per result file (a (model, seed) pair, a fine-tune, a
reading).  :func:`run_grid` locks the output folder (and the checkpoint folder, if any), skips the cells that
are finished, and runs the others in phases (every cell of one phase before any of the next: fine-tunes read
the weights that pre-training saved), one after the other or in a worker pool of ``jobs`` processes where
Ctrl-C stops every worker at once.  Each cell writes its result file atomically the moment it finishes and
logs one line; what finished is kept whatever happens after.

**The resume policy, the same for every experiment:** running the same command again continues the run.
A cell whose result file exists, was made with this run's configuration and passes its :class:`Schema` check
is skipped; a result file made with another configuration, or damaged (not JSON, another schema, keys
missing), is refused with a ``ValueError`` naming the file and what differs, before any work: it is never
replaced and never taken for this run's.  No flag is needed; ``--resume`` is accepted by every command and
changes nothing.  A cell that reads a checkpoint (a fine-tune reading its pre-trained weights) uses it when
it is there, and the experiment adds the cells that make it again when it is not.

Also here: :func:`load_results` (a results folder read through its schema, an error naming the bad file and
its missing keys), :func:`time_updates` (the measured cost of a run, before it), and the pieces of the
experiments' command lines (:func:`parse_selection`, :func:`run_command`, :data:`RESUME_HELP`).
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..checks import check_positive_int
from ..cli import INTERRUPTED, interrupted_message, settings_diff
from ..files import FolderLock, check_folder_path, read_json, removed_if_left_empty
from ..pool import run_calls
from ..seeds import parse_seed_list, set_seed

#: ``--resume`` of every experiment's command line
RESUME_HELP = ("accepted and changes nothing: the same command always resumes (finished result files made with "
               "these settings are skipped; one made with other settings is refused)")
#: what an interrupted command says to do next
AGAIN = "run the same command again to make the others (finished ones are skipped)"


# -- result files ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schema:
    """What every result record of one experiment holds: ``"schema": name`` and the keys ``fields``.

    ``check(record)`` may look further (values in range) and raise ``ValueError``; ``added_defaults`` are
    configuration fields added after some records were written, read as these values where a record lacks
    them (the older records were made with them)."""

    name: str
    fields: tuple[str, ...] = ("schema", "seed", "config")
    check: Callable[[dict], None] | None = None
    added_defaults: Mapping[str, Any] = field(default_factory=dict)

    def problem(self, rec: Any) -> str | None:
        """Why ``rec`` is not a record of this schema, or None."""
        if not isinstance(rec, dict):
            return f"it holds a {type(rec).__name__}, not a record"
        missing = sorted(set(self.fields) - set(rec))
        if missing:
            return f"missing keys {missing}"
        if rec.get("schema") != self.name:
            return f"schema {rec.get('schema')!r}"
        if self.check is not None:
            try:
                self.check(rec)
            except ValueError as err:
                return str(err)
        return None

    def validate(self, path: str | os.PathLike, rec: Any) -> dict:
        """``rec`` (read from ``path``) if it passes; else a ``ValueError`` naming ``path`` and what is wrong."""
        why = self.problem(rec)
        if why is not None:
            raise ValueError(f"{path} is not a {self.name} record ({why}); delete it (a rerun makes it again) "
                             "or restore it")
        return rec


def load_results(out: str | os.PathLike, schema: Schema, pattern: str = "*_seed*.json") -> list[dict]:
    """Every record in the folder ``out`` (files ``pattern``, in name order), each checked against ``schema``:
    a bad one is a ``ValueError`` naming it and its missing keys, a missing folder a ``FileNotFoundError``."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no results folder {out}")
    return [schema.validate(p, read_json(p)) for p in sorted(out.glob(pattern))]


def as_json(obj: Any) -> Any:
    """``obj`` as a result file holds it once written and read back (tuples become lists)."""
    return json.loads(json.dumps(obj))


def finished(path: str | os.PathLike, schema: Schema, config: Mapping[str, Any], *,
             profiles: Mapping[str, Any] | None = None, **settings) -> bool:
    """True when ``path`` holds a finished record of this run, False when there is no such file.

    The record must have been made with ``config`` (its ``"config"``) and hold the fields ``settings``
    (``trials=200``) beside it, and pass ``schema``; anything else is a ``ValueError`` naming the file and
    what differs (``steps 27 (now 20)``), with ``--profile NAME`` as the fix when the record's configuration
    is that of one of ``profiles`` (name -> configuration)."""
    path = Path(path)
    if not path.exists():
        return False
    rec = read_json(path)
    made = rec.get("config") if isinstance(rec, dict) else rec
    if isinstance(made, dict):
        made = {**{k: v for k, v in schema.added_defaults.items() if k in config}, **made}
        made = {**made, **{k: rec.get(k) for k in settings}}
    same_configuration(path, made, {**config, **settings}, profiles=profiles)
    schema.validate(path, rec)
    return True


def same_configuration(path: str | os.PathLike, made: Any, want: Mapping[str, Any], *,
                       profiles: Mapping[str, Any] | None = None) -> None:
    """Refuse (``ValueError``) the file ``path`` whose configuration ``made`` is not this run's ``want``, naming the
    fields that differ and the fix: ``--profile NAME`` when ``made`` is one of ``profiles`` (name ->
    configuration), else the settings it was made with."""
    want = as_json(want)
    if made == want:
        return
    other = made.get("name") if isinstance(made, dict) else None
    known = profiles is not None and other in profiles and all(
        made.get(k) == v for k, v in {**want, **as_json(profiles[other])}.items() if k in made)
    fix = f"--profile {other} to continue it" if known else "the settings it was made with"
    raise ValueError(f"{path} was made with another configuration: {settings_diff(made, want)}; pass another "
                     f"--out folder, or {fix}")


# -- the grid loop --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One result file of a grid and the call that makes it: ``fn(*args)`` writes ``path`` (atomically) and
    returns a one-line report.  Cells of a lower ``phase`` all run before any of a higher one."""

    path: Path
    fn: Callable[..., str]
    args: tuple = ()
    phase: int = 0


def run_grid(cells: Sequence[Cell], *, out: str | os.PathLike, schema: Schema, config: Mapping[str, Any],
             ckpt: str | os.PathLike | None = None, jobs: int = 1, log: Callable[[str], Any] = print,
             settings: Mapping[str, Any] | None = None, profiles: Mapping[str, Any] | None = None,
             also: Callable[[list[Cell]], list[Cell]] | None = None, progress: bool = False,
             desc: str = "models") -> list[Cell]:  # fmt: skip
    """Run every cell of ``cells`` whose result file is not finished (:func:`finished` with ``config``,
    ``settings`` and ``profiles``); returns the cells that ran.

    ``out`` (and ``ckpt``) are locked meanwhile; every result file is checked before the first cell runs.
    A cell given twice runs once.  ``also(todo)`` is called once every result file has passed, before any cell
    runs; it may return cells that the ones to run need (weights trained again), which run in their phase and
    count as no result.  ``jobs > 1`` runs each phase in a worker pool
    (a bar over its cells with ``progress``); Ctrl-C or an error stops every worker at once."""
    jobs = check_positive_int("jobs", jobs)
    first: dict[Path, Cell] = {}
    for c in cells:  # one cell per result file, the first given
        first.setdefault(Path(c.path).absolute(), c)
    cells = list(first.values())
    with ExitStack() as stack:
        stack.enter_context(FolderLock(out, what="--out folder", log=log))
        if ckpt is not None and Path(ckpt).absolute() != Path(out).absolute():
            stack.enter_context(FolderLock(ckpt, what="--ckpt folder", log=log))
        todo = [c for c in cells if not finished(c.path, schema, config, profiles=profiles, **(settings or {}))]
        if len(todo) < len(cells):
            log(f"skipping {len(cells) - len(todo)} finished result(s) in {out}")
        if also is not None:
            todo += [c for c in also(todo) if c not in todo]
        for phase in sorted({c.phase for c in todo}):
            calls = [(c.fn, c.args) for c in todo if c.phase == phase]
            run_calls(calls, jobs if len(calls) > 1 else 1, log, progress=progress, desc=desc)
    return todo


# -- timing ---------------------------------------------------------------------------------------
def time_updates(names: Sequence[str], build: Callable[[str], Any], train: Callable[[Any, int, int], Any],
                 measure: Callable[[str, Any], Any], *, updates: int, warmup: int, steps: int, threads: int,
                 profile: str, what: str = "eval", measures: float = 1.0, setup_cpu: float | None = None,
                 log: Callable[[str], Any] = print) -> dict[str, Any]:  # fmt: skip
    """CPU and wall seconds per training update of each model of ``names`` and of its measurement; the projected
    cost of the run with 3 seeds.

    ``build(name)`` makes a model (after ``set_seed(0)``), ``train(model, n, seed)`` runs ``n`` updates
    (``warmup`` untimed ones first), ``measure(name, model)`` what the run measures after training, ``measures``
    times per run.  ``setup_cpu`` (reading the data, say) is added once per model and recorded as ``data_cpu``.
    On cores shared with other work the CPU time is the figure to plan with (wall time stretches with the load);
    the caller sets the threads the run uses (``threads``, recorded)."""
    updates, warmup = check_positive_int("updates", updates), check_positive_int("warmup", warmup)
    rows: dict[str, dict[str, float]] = {}
    for name in names:
        set_seed(0)
        model = build(name)
        train(model, warmup, 0)
        w0, c0 = time.perf_counter(), time.process_time()
        train(model, updates, 1)
        w1, c1 = time.perf_counter(), time.process_time()
        measure(name, model)
        w2, c2 = time.perf_counter(), time.process_time()
        rows[name] = {"wall_per_update": (w1 - w0) / updates, "cpu_per_update": (c1 - c0) / updates,
                      f"{what}_wall": w2 - w1, f"{what}_cpu": c2 - c1}  # fmt: skip
        r = rows[name]
        log(f"{name}: {r['cpu_per_update'] * 1000:.1f} ms CPU per update ({r['wall_per_update'] * 1000:.1f} ms wall), "
            f"{what} {r[f'{what}_cpu']:.1f} s CPU ({r[f'{what}_wall']:.1f} s wall)")  # fmt: skip
    extra = setup_cpu or 0.0
    cpu = 3 * sum(r["cpu_per_update"] * steps + r[f"{what}_cpu"] * measures + extra for r in rows.values())
    wall = 3 * sum(r["wall_per_update"] * steps + r[f"{what}_wall"] * measures + extra for r in rows.values())
    log(f"projected for {len(rows)} models x 3 seeds ({steps} updates each): {cpu / 60:.1f} CPU minutes "
        f"({wall / 60:.1f} minutes at the wall-clock rate measured here); with --jobs 2 on 2 free cores about "
        f"{cpu / 120:.1f} minutes of wall time")  # fmt: skip
    return {"profile": profile, "updates_timed": updates, "steps": steps, "threads": threads,
            **({} if setup_cpu is None else {"data_cpu": round(setup_cpu, 2)}),
            "per_model": {n: {k: round(v, 4) for k, v in r.items()} for n, r in rows.items()},
            "cpu_seconds_3_seeds": round(cpu, 1), "wall_seconds_3_seeds": round(wall, 1), "torch": torch.__version__}


# -- command line ---------------------------------------------------------------------------------
def parse_seeds(p, text: str) -> list[int]:
    """``--seeds``, checked: a bad value ends the command through ``p.error`` with one line naming it."""
    try:
        return parse_seed_list(text)
    except ValueError as err:
        p.error(str(err))


def parse_names(p, text: str, valid: Sequence[str], *, flag: str = "--models", what: str = "model",
                all_word: str | None = "all", note: str | None = None) -> list[str]:
    """A comma-separated list of names from ``valid`` (``all_word`` alone: every one), checked: an unknown name or
    an empty list ends the command through ``p.error`` with one line naming it and the valid choices (then
    ``note``, by default ``, or 'all'``)."""
    if all_word is not None and text.strip() == all_word:
        return list(valid)
    names = [m.strip() for m in text.split(",") if m.strip()]
    choices = ", ".join(valid) + (note if note is not None else f", or {all_word!r}" if all_word else "")
    if not names:
        p.error(f"{flag} is empty ({text!r}); valid choices: {choices}")
    bad = [m for m in names if m not in valid]
    if bad:
        p.error(f"unknown {what}(s) {bad}; valid choices: {choices}")
    return list(dict.fromkeys(names))


def parse_selection(p, a, valid: list[str]) -> tuple[list[int], list[str]]:
    """``--seeds``, ``--models`` and ``--jobs`` of a command line, checked: bad values end the command through
    ``p.error`` with one line naming the value and the valid choices."""
    seeds = parse_seeds(p, a.seeds)
    flag = next(x for x in p._actions if x.dest == "models").option_strings[0]
    names = parse_names(p, a.models, valid, flag=flag)
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    return seeds, names


def run_command(p, out, ckpt, work: Callable[[], Any], *, again: str = AGAIN,
                done: Callable[[Any], str] = lambda _: "") -> int:  # fmt: skip
    """The end of an experiment's command line: refuse an ``--out`` or ``--ckpt`` (None: none) that is a file or
    lies under one, run ``work()``, and turn its refusals and Ctrl-C into one line on stderr (exit 2, or
    :data:`INTERRUPTED` saying ``again``).  On success one line says where the results are, then ``done(what
    work returned)``."""
    folders = [("--out", out)] + ([("--ckpt", ckpt)] if ckpt is not None else [])
    for flag, folder in folders:
        try:  # every one before the first is made: a --ckpt under a file must not leave an empty --out behind
            check_folder_path(folder, flag)
        except ValueError as err:
            p.error(str(err))
    t0 = time.perf_counter()
    try:
        with removed_if_left_empty(*(f for _, f in folders)):  # a refusal in the lock leaves no folder it made
            result = work()
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"finished results are kept in {out}", again), file=sys.stderr)
        return INTERRUPTED
    print(f"all done in {time.perf_counter() - t0:.0f} s; results in {out}{done(result)}")
    return 0


__all__ = ["Schema", "Cell", "RESUME_HELP", "load_results", "finished", "run_grid", "time_updates", "parse_seeds",
           "parse_names", "parse_selection", "run_command"]  # fmt: skip
