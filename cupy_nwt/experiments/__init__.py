"""NVIDIA's two transfer experiments and the simulated training step, on CuPy through ``cupy_nwt.cuda``.

* ``transfers``: pageable vs pinned H2D/D2H over a size sweep, one copy vs many small ones, GB/s
  against the PCIe link ("How to Optimize Data Transfers in CUDA").
* ``overlap``: sequential vs async v1/v2 over N streams, the result checked ("How to Overlap Data
  Transfers in CUDA").
* ``step_sim``: a kernel of known duration standing in for a training step, to measure how long
  the GPU waits for the loader.
* ``timing``: CUDA-event timing that all three share, and ``queued_time``: work queued behind a spin
  kernel so a window holds what the GPU ran, with Python's time to issue it apart.
* ``duplex``: H2D and D2H alone and at once, and ``pipeline_model``: the overlap's ideal, and the
  same ideal rebuilt from the duplex rates and the hand-off, for ``overlap``.
* ``batching``: one big copy vs many small ones, for ``transfers``.
* ``kernels``: the CUDA C kernels (``cuda_src/*.cu``) compiled at run time; ``kernel_check`` compiles
  them for sm_90 with nvcc in CI (no GPU needed), and ``bench/native/`` builds them into the native
  reference.
"""
