"""The project's benchmarks: ``bench.workloads`` (the workloads the studies and suites share), the studies
under ``studies/`` (one folder per question, each its script, README and result files), the suites
(pytest-benchmark) and the GPU machine's session script. Not part of the installed package."""
