"""The demo: the product's main job on embedded defaults, end to end (``lanes demo``).

- :mod:`lanes.demo.run`: the run itself (services, fleet, workload, summary);
- :mod:`lanes.demo.services`: the beat, a memory worker and the HTTP API, each a process;
- :mod:`lanes.demo.control`: the adaptive step (a controller following its backend's capacity);
- :mod:`lanes.demo.memory`: the memory step (chats in, memory runs out);
- :mod:`lanes.demo.plot`: every lane's width and in-flight count over time;
- :mod:`lanes.demo.report`: the summary printed at the end, and its plot.

Nothing of the product imports this package.
"""
