"""``python -m nxrt_fuzz``: the differential fuzzer's command line (see :mod:`nxrt_fuzz`)."""

from nxrt_fuzz import main

main()
