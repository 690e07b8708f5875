"""Cost benchmarks for the position schemes of posenc_lib.

Run ``python -m benchmarks.run`` (or ``make bench``); ``--quick`` runs a tiny
configuration in seconds.  Three measurements, each reported as a ratio to the
``none`` scheme measured in the same process and the same run:

1. training step (forward + backward) per scheme and length (:mod:`benchmarks.train`);
2. peak memory of one training step, one subprocess per scheme (:mod:`benchmarks.memory`);
3. greedy decoding with and without the key/value cache (:mod:`benchmarks.decode`).

See benchmarks/README.md for what each figure means.
"""
