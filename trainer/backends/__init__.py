"""Trainer backends behind one interface: the CPU reference backend and veRL on GPUs."""
