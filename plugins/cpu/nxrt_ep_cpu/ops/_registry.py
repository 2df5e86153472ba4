"""The cpu EP's kernel table; every family module registers into it with ``@op``."""

from nxrt.registry import OpRegistry

CPU_OPS = OpRegistry("cpu")
op = CPU_OPS.op
