"""Horovod's gradient compression for hora.torch: Compression.none, Compression.fp16 and
Compression.bf16 (beyond Horovod). A compressor casts a floating-point tensor to a 16-bit float
before the allreduce and back after it; other tensors pass unchanged."""
import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast_compressor(dtype, doc):
    class _Cast(Compressor):
        __doc__ = doc

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point:
                return tensor.to(dtype), tensor.dtype
            return tensor, tensor.dtype

        @staticmethod
        def decompress(tensor, ctx):
            if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
                return tensor.to(ctx)
            return tensor
    return _Cast


FP16Compressor = _cast_compressor(torch.float16, "Floating-point tensors travel as float16.")
FP16Compressor.__name__ = FP16Compressor.__qualname__ = "FP16Compressor"
BF16Compressor = _cast_compressor(torch.bfloat16, "Floating-point tensors travel as bfloat16.")
BF16Compressor.__name__ = BF16Compressor.__qualname__ = "BF16Compressor"


class Compression:
    """Compression algorithms: pass `compression=Compression.fp16` to allreduce or
    DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
