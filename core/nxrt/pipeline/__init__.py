"""Session creation and execution: load -> select -> optimize -> place -> plan -> instantiate.

:mod:`~nxrt.pipeline.stages` holds one function per stage and the frozen values
passed between them; the modules beside it are what the stages use: loading
and checking a model (``model``, ``values``, ``external_data``, ``contained``),
the graph passes (``optimizer``, ``overrides``), choosing EPs (``selection``),
placing nodes (``partition``), handing weights over (``weight_binding``) and
the plan and the loop that runs it (``executor``).

May import: the package root (the EP-author API) and :mod:`nxrt.moe`; never
:mod:`nxrt.ort` or :mod:`nxrt.tools`, which are built on it.
"""
