"""The command lines' shared pieces: :class:`CliParser` (a bad flag is one line on stderr and exit status 2), the
interrupted exit (:data:`INTERRUPTED`, :func:`interrupted_message`), :func:`settings_diff` (what a refusal to
resume names) and :func:`timing_command` (``--time-updates``)."""
from __future__ import annotations

import argparse
import os
from typing import Any

from .files import atomic_write_json, check_file_path, refuse_overwrite


class CliParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line on stderr and exit status 2.

    argparse prints the whole usage block before the error; on a long command line the one line
    that matters scrolls out of view.  Here the error is the only line, with a pointer to ``--help``.
    """

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102
        ns, extras = super().parse_known_args(args, namespace)
        for action in self._actions:  # Python 3.11's argparse turns "--flag=--" into [] instead of an error
            value = getattr(ns, action.dest, None)
            if action.option_strings and action.nargs is None and value == [] and action.default != []:
                self.error(f"argument {action.option_strings[-1]}: expected one value")
        return ns, extras


#: the exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it
INTERRUPTED = 130


_MISSING = object()  # a field one of two records lacks


def _flat_settings(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_diff(old: Any, new: dict[str, Any], *, limit: int = 6) -> str:
    """The settings that differ between ``old`` (as a results file recorded them) and ``new`` (this run's), each
    as ``field OLD (now NEW)``: nested records by dotted name (``passkey_training.trials``), ``name`` first,
    at most ``limit`` of them then how many more; ``""`` when none differ.  A refusal to resume quotes it,
    so the user sees which flag or profile to change back."""
    def show(v: Any) -> str:
        text = "<none>" if v is _MISSING else repr(v)
        return text if len(text) <= 60 else text[:57] + "..."

    if not isinstance(old, dict):
        return f"no settings recorded (found {show(old)})"

    was, now = _flat_settings(old), _flat_settings(new)
    keys = list(dict.fromkeys([*now, *was]))
    diff = [k for k in keys if was.get(k, _MISSING) != now.get(k, _MISSING)]
    diff.sort(key=lambda k: k.rsplit(".", 1)[-1] != "name")  # the profile's name first: often the whole story
    shown = [f"{k} {show(was.get(k, _MISSING))} (now {show(now.get(k, _MISSING))})" for k in diff[:limit]]
    more = f" and {len(diff) - limit} more" if len(diff) > limit else ""
    return ", ".join(shown) + more


def interrupted_message(what_kept: str, how_to_continue: str) -> str:
    """The one line a command prints when Ctrl-C stops it."""
    return f"interrupted: {what_kept}; {how_to_continue}"


def timing_command(p: argparse.ArgumentParser, a: argparse.Namespace, measure, *, record_load: bool = True) -> int | None:
    """``--time-updates N [--timing-out FILE] [--overwrite]`` of the character-model experiments, in one place.

    Checks the flags and the output file before any timing (one line naming the value via ``p.error``);
    returns ``None`` when no timing was asked for (the command goes on), else the exit code: 0 after
    ``measure(N)`` ran (its dict written atomically to ``--timing-out``, with the load average before the
    timing when ``record_load``), :data:`INTERRUPTED` after Ctrl-C, with nothing written.
    """
    if a.time_updates < 0:
        p.error(f"--time-updates must be >= 0, got {a.time_updates}")
    if a.timing_out and not a.time_updates:
        p.error("--timing-out needs --time-updates N")
    if a.timing_out:  # checked before the timing, not after
        try:
            check_file_path(a.timing_out, "--timing-out")
            if not a.overwrite:
                refuse_overwrite([a.timing_out], advice="or give another --timing-out")
        except (FileExistsError, ValueError) as err:
            p.error(str(err))
    if not a.time_updates:
        return None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        timing = measure(a.time_updates)
    except KeyboardInterrupt:  # the timings are written once, at the end
        import sys

        print(interrupted_message("nothing was written" + (f" to {a.timing_out}" if a.timing_out else ""),
                                  "run the same command again"), file=sys.stderr)
        return INTERRUPTED
    if a.timing_out:
        if record_load:
            timing["load_average_before"] = None if load is None else round(load, 2)
        atomic_write_json(a.timing_out, timing)
    return 0
