"""Turning results into what people and machines read: the public API the commands and ``bench/`` share.

It sits on the lowest floor, beside ``errors`` (it imports nothing of the data sources, the loader, the
tuner or the commands), so every part may report through it:

* ``units``: byte sizes and counts said and parsed (``fmt_bytes``, ``parse_size``, ``plural``);
* ``tables``: fixed-width tables, and result files written atomically as JSON (``table``, ``write_json``);
* ``figures``: a headline figure from repeats, its bootstrap interval and its target's verdict
  (``median_interval``, ``figure``, ``judge``);
* ``progress``: a progress bar on stderr that stays out of pipes and logs (``ProgressBar``);
* ``plots``: what every PNG plot shares (matplotlib found or named, a legend outside, an atomic write).
"""
