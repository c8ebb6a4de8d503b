"""What every compilation step above builds on: ATen overloads as thunder symbols (``aten``), the
per-thread FakeTensorMode (``fake``), the torch state traced graphs depend on (``trace_state``) and
the record of one compilation (``compilation``)."""
