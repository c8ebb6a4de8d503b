"""torch.ops.aten overloads as first-class thunder symbols, decomposed into thunder prims."""
