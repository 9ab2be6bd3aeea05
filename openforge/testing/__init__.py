"""Helpers shared by the tests and the benchmarks: a fast vLLM-format upstream, a proxy running in
a thread, a scripted model policy, synthetic rollouts and fixed episodes. Real servers and real
code paths only; nothing here replaces a system under test."""
