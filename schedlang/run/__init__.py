"""Building, verifying and timing kernels: TVM's build, the sandboxed worker, the RPC runner."""
