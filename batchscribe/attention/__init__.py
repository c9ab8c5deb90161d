"""Attention kernels for the decoder step: the interface (base), one module per backend (sdpa,
flashinfer, triton with its kernels), and the registry that resolves names to kernels once."""
