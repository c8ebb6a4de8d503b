"""What plugins and the core share, importing nothing else of thunderplug and no thunder: the
records plugins register (``specs``), the hook specifications (``hookspecs``), plugin statuses
(``report``), environment settings (``settings``), warnings issued once (``notices``), availability
checks plugins call before importing CUDA code (``availability``) and the distribution's version."""
