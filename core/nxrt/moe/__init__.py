"""Mixture-of-experts machinery: which experts are resident in memory (``residency``)
and the numpy reference of ``pkg.nxrt::BlockQuantizedMoE`` (``reference``).

EPs that run MoE layers get an expert residency manager from the session.
May import: the package root only.
"""
