"""The Num Worker Tuner (NWT): pick the loader's worker count by measuring it.

One idea per module, arrows pointing one way (cli -> nwt -> loader -> datasets, cuda):

* ``trials``: what one trial reports (:class:`~cupy_nwt.nwt.trials.Measurement`), how runs of a
  count combine, and the runner the searches share; pure, no loader.
* ``paper``: Algorithm 1 of the paper, with our reading of what it leaves open; ``fast``: the
  coarse-to-fine search; ``tune``: :func:`~cupy_nwt.nwt.tune.tune_num_workers`, which runs either.
* ``measure``: a trial on the real :class:`~cupy_nwt.loader.DataLoader`; the only module here that
  imports the loader.
* ``store``: :class:`~cupy_nwt.nwt.store.TuneResult` and the machine-wide store of picks, keyed by
  ``fingerprint``; ``memory`` samples the loader's footprint during a trial.
* ``placement``: :func:`~cupy_nwt.nwt.placement.tune_decode_placement`: where JPEGs decode (CPU
  workers or the GPU fed by readers), each placement searched by ``tune``, the shorter loop picked.
* ``pick``: ``num_workers="auto"``: the saved pick, else one tuning through a registered tuner;
  ``auto``: that tuning (once per machine, under a file lock), registered when it is imported.

The loader imports only ``pick`` (and through it ``store`` and ``fingerprint``), never the tuner:
the tuner builds loaders, so the loader importing it would close a circle. This package's
``__init__`` therefore imports nothing, so that importing ``cupy_nwt.nwt.pick`` from the loader
does not pull the tuner (and the loader) in. Users import from ``cupy_nwt``.
"""
