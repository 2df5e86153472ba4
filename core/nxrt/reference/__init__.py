"""Plain numpy reference implementations of nxrt's own operators (for tests and tools)."""
