"""hora.torch.SyncBatchNorm: batch normalization over the batch of all ranks (Horovod's
SyncBatchNorm). In training, per-channel sums (count, sum, sum of squares) are allreduced so that
every rank normalizes with the statistics of the concatenated batch; backward allreduces the two
per-channel sums the input gradient needs. Weight and bias gradients stay local (the optimizer
averages them like any other gradient)."""
import torch
import torch.nn.functional as F

from ._core import Sum
from ._core import size as _size
from ._torch_ops import allreduce


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        xd = x.double()
        local = torch.cat([xd.sum(dims), (xd * xd).sum(dims),
                           torch.tensor([x.numel() / c], dtype=torch.float64, device=x.device)])
        tot = allreduce(local, op=Sum)
        n = tot[-1]
        mean = tot[:c] / n
        var = (tot[c:2 * c] / n - mean * mean).clamp_min(0)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * n / (n - 1) if n > 1 else var
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        invstd = (var + eps).rsqrt()
        xhat = (xd - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.double().view(shape) + bias.double().view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n, ctx.dims, ctx.shape = n, dims, shape
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape, n = ctx.dims, ctx.shape, ctx.n
        dyd = dy.double()
        sum_dy = dyd.sum(dims)
        sum_dy_xhat = (dyd * xhat).sum(dims)
        c = sum_dy.numel()
        g = allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=Sum)
        scale = invstd if weight is None else invstd * weight.double()
        dx = (dyd - (g[:c] / n).view(shape) - xhat * (g[c:] / n).view(shape)) * scale.view(shape)
        dw = db = None
        if weight is not None:
            dw, db = sum_dy_xhat.to(weight.dtype), sum_dy.to(weight.dtype)
        return dx.to(dy.dtype), dw, db, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm over every rank's batch (N, C, ...). Same arguments as torch.nn.BatchNorm*d;
    collective in training (every rank must run forward and backward), local in eval."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if not self.training and self.track_running_stats or _size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, self.training or not self.track_running_stats,
                                self.momentum if self.momentum is not None else 0.0, self.eps)
        momentum = self.momentum if self.momentum is not None else \
            1.0 / float(self.num_batches_tracked)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if self.track_running_stats else None,
                                      self.running_var if self.track_running_stats else None,
                                      self.eps, momentum)
