"""Entries kept by scheme class (a scheme's own kernel or FlexAttention form), found for a scheme instance."""
from __future__ import annotations


def for_class(table: dict, scheme):
    """The entry of ``table`` (keyed by scheme class) for ``scheme``: its class's, or its nearest base class's where
    ``scheme``'s class keeps that base's ``bias``, ``scores`` and ``values`` (a subclass that changes a term is not the
    scheme the entry was written for); else ``None``."""
    cls = type(scheme)
    base = next((c for c in cls.__mro__ if c in table), None)
    if base is None or any(getattr(cls, hook) is not getattr(base, hook) for hook in ("bias", "scores", "values")):
        return None
    return table[base]
