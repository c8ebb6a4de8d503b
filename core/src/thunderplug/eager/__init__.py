"""Eager semantics thunder 0.2.6 departs from, each computed here and wired into thunder by
``thunderplug.wiring``: which outputs require grad (``output_grads``), gradients of tensors updated
in place (``inplace_grads``), broadcast gradients (``broadcast_grads``), the branch of
``is_compiling()`` taken (``compile_branches``), ``torch.vmap`` as one op (``functorch_transforms``)
a ``Tensor.to`` that changes nothing (``tensor_to``), the tensor API thunder's proxies lack or shape
otherwise (``tensor_api``: ``%``, ``torch.return_types`` results, lerp's broadcast start) and the result dtypes
of elementwise ops mixing tensors with dimensions, 0-dim tensors and numbers (``type_promotion``)."""
