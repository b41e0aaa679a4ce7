"""The rules every node of a run applies identically, apart from the node's plumbing around them.

- `windows`: the time model (blocks → windows → put windows and deadlines);
- `succession`: who leads each window, slot by slot;
- `peers`: which peers' payloads make a window's outer step;
- `outer`: the outer step itself (aggregation, learning rate, application);
- `follow`: every node takes the step its window's lead published;
- `fingerprint`: whether a node holds the run's model.

Each is a pure function of public inputs (the run's hparams, the chain, the buckets' signed objects),
so any two honest nodes that read the same inputs reach the same θ. The node's own start-up, state,
records, metrics and training loop stay in `templar.runtime`.
"""
