"""Scripts people run: the demo, the benchmarks, the simulator, build and chart scripts.

The local test cluster they start is the ``testbed`` package.
"""
