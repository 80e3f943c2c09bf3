"""The GPU side: contexts, modules, kernels, parameters, memory and streams."""
