"""Device meshes, logical-axis rules and a jit-based Partitioner for t5x."""
