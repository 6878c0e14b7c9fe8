"""The implementations of relu² under test in this repository, for the instrument in ``relu2``.

This package is what a commit changes when it changes a kernel: the fused op of ``csrc/`` (a CUDA
kernel and its C++ CPU twin), the hand-written Triton kernel, and the calls vLLM makes to
``torch.compile``.  It speaks interface 1 (``relu2.interface``): each factory of ``relu2_impls.entry_points``
is an entry point in the group ``relu2.implementations`` (``pyproject.toml``), called when its
implementation is first asked for, so listing them builds nothing.

The instrument (contract, timers, isolation, suites, gate) never comes from here: ``relu2 asv run``
measures every commit's ``relu2_impls`` with one and the same ``relu2``.
"""

