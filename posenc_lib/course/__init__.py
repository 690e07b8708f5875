"""What the notebooks use beyond the library proper.

* ``notebook.py``: the setup every lesson's first cell runs (seed, threads, quiet stderr, plot style);
* ``scorecard.py``: every scheme against lesson 01's requirements, with checks that confirm verdicts;
* ``explorers.py``: interactive figures (a knob of an encoding, and what changes).
"""
