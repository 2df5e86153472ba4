"""The onnxruntime-shaped shell: ``InferenceSession``, ``SessionOptions``, ``OrtValue``,
``IOBinding``, devices, LoRA adapters, sparse tensors and the process-wide calls.

Its public names are re-exported at the package root (``nxrt.InferenceSession``)
and, in onnxruntime's module layout, under :mod:`nxrt.capi`; import them from
there. May import: the package root, :mod:`nxrt.pipeline` and :mod:`nxrt.moe`.
"""
