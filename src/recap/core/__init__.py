"""The model-free algorithm: everything here takes token ids and small arrays, knows no model,
and is tested on the CPU in microseconds.

- ``tree``: ``DraftTree`` (tokens, parents, depths, sources, probs) and ``Source``.
- ``topk``: ``TopK``, the target's top-k rows at verified positions, and their concentration.
- ``memory``: ``TokenMemory`` (persistent, [vocab, k] + kept 2-/3-token rows + calibration) and
  ``ContextTable`` (a 2-/3-token hash table); ``persist``: their file on disk.
- ``calibration``: acceptance rate per cell (source, depth, q): calibrated draft scores.
- ``step_cost``: step time per tree size, learned as the run goes, and the size rule.
- ``suffix``: a suffix automaton over the request.
- ``accept`` (greedy acceptance), ``sampling`` (sample-then-walk), ``rules`` (generate's logits
  processors, token choice and stopping criteria, token by token), ``stats`` (``DecodeStats``).
"""
