"""The wiring into thunder: the table of patches (``patches``) and the replacements it installs that
belong to no feature below: thunder bug fixes (``fixes``), compilations shared across modules of one
structure (``sharing``), the same results for less work (``speedups``) and thunderfx's subclass graphs
(``thunderfx``). The only layer that imports the features it wires; nothing below imports it."""
