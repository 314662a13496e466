"""The T5X checkpoint format (msgpack + TensorStore zarr) read and written: async, atomic, multi-host."""
