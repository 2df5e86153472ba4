"""What is built on the runtime: the ``nxrt`` command (``cli``), ``nxrt compile``
(``compile``), the ONNX conformance runner (``conformance``), the EP authors' pytest
kit (``testing``, ``ep_suite``), the onnx package's light models (``light_models``)
and batch inference on Ray Data (``batch``).

May import anything in nxrt; nothing in nxrt outside this package imports it.
"""
