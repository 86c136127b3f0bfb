"""Readable Python references of the compiled kernels (``recap.kernels``).

Nothing in the library imports these at run time; the tests hold each kernel equal to its
reference on many random cases (``tests/test_compiled.py``), so the algorithm can be read here
and changed here first.

- ``fusion``: entropy-confidence / fixed / strict fusion of the rows found for a context.
- ``tree_builder``: the best-first tree, the size choice, the depth-first layout, the suffix graft.
- ``context_memory``: the 2-/3-token memory as a dict (``ContextTable`` is its hash-table twin).
- ``verify``: greedy acceptance and the tree's ancestor mask.
"""
