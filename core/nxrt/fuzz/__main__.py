"""``python -m nxrt.fuzz``: the differential fuzzer's command line (see :mod:`nxrt.fuzz`)."""

from nxrt.fuzz import main

main()
