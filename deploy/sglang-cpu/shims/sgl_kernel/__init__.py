"""Stand-in for sgl_kernel on a CPU without AMX (PyPI has CUDA builds only).

SGLang's CPU engine takes PyTorch paths on such a CPU, but two of its modules import these two
bookkeeping helpers at module level; plain PyTorch versions of them are all the server needs.
Other names (speculative decoding's tree kernels, imported at start-up, never called without a
draft model) resolve to a function that raises naming itself.
Only ever put on an SGLang server's PYTHONPATH (deploy/sglang-cpu/install.sh), never on rollway's.
"""

import ctypes


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """For request i, write its next end-start cache slots from out_cache_loc into its row."""
    position = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[position : position + count].to(req_to_token.dtype)
        position += count


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For each layer buffer (a data pointer and its row stride in bytes), copy row src to row tgt."""
    for pointer, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        for target, source in zip(tgt_loc.tolist(), src_loc.tolist(), strict=True):
            ctypes.memmove(pointer + target * stride, pointer + source * stride, stride)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel stand-in: {name} has no CPU implementation here")

    unavailable.__name__ = name
    return unavailable
