"""The plugin host: finding, isolating and ordering plugins (``discovery``), thunderplug's own
executors as default plugins (``builtins``), claims turned into thunder executors (``claims``) and
the executor list ``discover()`` returns (``executors``)."""
