"""The ``thunderplug`` command (``cli``: plugins, explain, demo) and what it shows: the claims and
regions of a compilation (``explain``) and the demo (``demo``)."""
