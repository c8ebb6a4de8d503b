"""Which compilations are made, kept and shared: the regions a model is compiled in (``regions``),
compilations shared by modules of one structure (``reuse``) and the recompile limit (``recompiles``)."""
