"""What a tuning found and where it is kept: the floor between the data and the loader.

* ``trials``: a run of a worker count (:class:`~cupy_nwt.picks.trials.Trial`) and how repeated
  runs combine; ``verdict``: a result's one-line why and its noise warning.
* ``fingerprint``: what a pick is keyed by (the machine and the work); ``schema``: every field of a
  stored pick checked before it is trusted.
* ``store``: :class:`~cupy_nwt.picks.store.TuneResult` and saving it; ``store_file``: the machine-wide file of picks.
* ``pick``: ``num_workers="auto"``'s request, its saved pick, and the pick a loader tuned online saves.

The loader reads and saves picks here; the offline search (``cupy_nwt.nwt``) builds loaders and
saves its results here too. Users import from ``cupy_nwt``.
"""
