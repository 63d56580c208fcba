"""Adaptive lane widths: the control laws, their state in Redis, the loop that applies them.

- :mod:`lanes.control.laws`: pure laws (``overload``, ``vllm``, ``utilisation``) and their veto composition;
- :mod:`lanes.control.store`: the per-pool state, the lease and the walkers' reports in Redis;
- :mod:`lanes.control.scrape`: vLLM's gauges for a pool;
- :mod:`lanes.control.loop`: one pool's decision per interval, under the lease;
- :mod:`lanes.control.steward`: the thread in every worker that follows widths and leads pools;
- :mod:`lanes.control.simulate`: a deterministic discrete-event harness for the laws.

The width a lane must run at is decided by :mod:`lanes.pools` (the one width authority).
"""
