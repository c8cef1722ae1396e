"""The Num Worker Tuner (NWT): pick the loader's worker count by measuring it.

One idea per module, arrows pointing one way (cli -> nwt -> loader -> picks -> data, cuda):

* ``trials``: what one trial reports (:class:`~cupy_nwt.nwt.trials.Measurement`) and the runner
  the searches share; each run is recorded as a ``picks.trials.Trial``. Pure, no loader.
* ``paper``: Algorithm 1 of the paper, with our reading of what it leaves open; ``fast``: the
  coarse-to-fine search; ``tune``: :func:`~cupy_nwt.nwt.tune.tune_num_workers`, which runs either.
* ``measure``: a trial on the real :class:`~cupy_nwt.loader.DataLoader`; the only module here that
  imports the loader. ``footprint`` samples the loader's memory during a trial.
* ``placement``: :func:`~cupy_nwt.nwt.placement.tune_decode_placement`: where JPEGs decode (CPU
  workers or the GPU fed by readers), each placement searched by ``tune``, the shorter loop picked.

What a search finds is kept in ``cupy_nwt.picks`` (``TuneResult``, the store, the fingerprint),
below the loader: ``DataLoader(num_workers="auto")`` reads a saved pick there, and on a miss tunes
online and saves what it settled at there, never calling this package (whose trials build loaders).
Users import from ``cupy_nwt``.
"""
