"""The t5x-launch CLI: gin configs, job assembly, the built-in demo, local and TPU-pod launch."""
