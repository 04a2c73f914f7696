"""NaN or infinite steps: `NonFiniteGuard` flags them on the device (no host sync per step) and raises
`NonFiniteError` where the loop synchronises anyway (a log line, before a checkpoint). With
on_nonfinite="stop" the first one stops the run; with "skip" such a step leaves the weights and the
optimizer's state as they were, and more than max_skipped_steps of them stop the run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from tessera.train import distributed as dist_utils


class NonFiniteError(RuntimeError):
    """The loss or gradient norm became NaN or infinite: the run stops before such weights are saved."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP (DTensor) tensor, sharing its storage; a plain tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class NonFiniteGuard:
    """The run's non-finite flag and skipped-step count, both on the device."""

    def __init__(self, on_nonfinite: str, max_skipped_steps: int, device: torch.device,
                 scaler: torch.amp.GradScaler) -> None:
        self.on_nonfinite, self.max_skipped_steps, self.scaler = on_nonfinite, max_skipped_steps, scaler
        self.skipping = on_nonfinite == "skip"
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.finite_until = 0  # the last batch known to be finite
        self._flag: torch.Tensor | None = None  # read only where the loop syncs anyway

    def note(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> torch.Tensor | None:
        """OR this step's "loss or grad norm is not finite" into the device flag, without a host sync.
        With float16 a scaler skips steps whose gradients overflow, so only the loss counts there.

        With on_nonfinite="skip" the step's flag is returned instead (the same on every rank: the losses
        differ per rank, so it is all-reduced, a collective on the device), counted in `skipped`, and the
        device flag is "more than max_skipped_steps were skipped"."""
        values = [loss.float()]
        if grad_norm is not None and not self.scaler.is_enabled():
            values.append(grad_norm.float().to(loss.device))
        bad = ~torch.isfinite(torch.stack(values)).all()
        if not self.skipping:
            self._raise_flag(bad)
            return None
        skip = dist_utils.all_reduce_(bad.float().reshape(1), "max")[0] > 0
        self.skipped += skip
        self._raise_flag(self.skipped > self.max_skipped_steps)
        return skip

    @torch.no_grad()
    def step_unless(self, skip: torch.Tensor, opt: torch.optim.Optimizer) -> None:
        """`opt.step()`, leaving the weights and the optimizer's state as they were where the device flag
        `skip` is set, decided on the device as GradScaler does with `found_inf`: under fp16 the flag joins
        the scaler's found_inf; a fused optimizer (`_step_supports_amp_scaling`, e.g. AdamW(fused=True))
        takes it as found_inf; any other optimizer steps and what it changed is put back where the flag is
        set (a copy of the weights and state is kept during the step; state the step created is reset to
        zeros, i.e. new). A state tensor kept on another device than the flag (a non-fused torch Adam's step
        counter, on the CPU, for a GPU model) needs the flag there: one copy per device and step."""
        if self.scaler.is_enabled():  # the gradients were unscaled: the scaler knows this step's overflow
            for found_inf in self.scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values():
                found_inf.copy_(torch.maximum(found_inf, skip.to(found_inf)))
            self.scaler.step(opt)
            return
        if getattr(opt, "_step_supports_amp_scaling", False):
            opt.grad_scale, opt.found_inf = None, skip.float()  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
            return
        params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
        before = [(_local(p).clone(), {key: _local(value).clone() for key, value in opt.state.get(p, {}).items()
                                       if torch.is_tensor(value)}) for p in params]
        opt.step()
        flags = {skip.device: skip}  # the flag on each device a tensor lives on, copied there once

        def keep_where(live: torch.Tensor, old: torch.Tensor | None) -> None:
            """`live` back to `old` (zeros if it did not exist) where the flag is set, on its device."""
            flag = flags.get(live.device)
            if flag is None:
                flag = flags[live.device] = skip.to(live.device)
            if old is None:
                live.masked_fill_(flag, 0)
            else:
                torch.where(flag, old, live, out=live)  # in place: no temporary per tensor

        for p, (weights, state) in zip(params, before, strict=True):
            keep_where(_local(p), weights)
            for key, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value):
                    keep_where(_local(value), state.get(key))

    def _raise_flag(self, flag: torch.Tensor) -> None:
        self._flag = flag if self._flag is None else self._flag | flag

    def check(self, batch: int, optimizers: Sequence[torch.optim.Optimizer],
              params: Iterable[torch.Tensor] = ()) -> None:
        """Raise NonFiniteError (on every rank) if any step since the last check was not finite. Called
        where the loop synchronises already (logging, before a checkpoint), so a GPU step never waits.
        Before a checkpoint pass the weights (`params`) too: the last step's update may have overflowed
        them. `batch` is the batch the run is at."""
        shards = [_local(p) for p in params]  # FSDP: this rank's shard
        if shards:
            self._raise_flag(~torch.stack([torch.isfinite(p).all() for p in shards]).all())
        if self._flag is None:
            return
        flag = dist_utils.all_reduce_(self._flag.float().reshape(1), "max")
        if flag.item() and self.skipping and self.skipped.item() > self.max_skipped_steps:
            raise NonFiniteError(
                f"{self.skipped.item()} steps were skipped by batch {batch} because their loss or "
                f"gradient norm was NaN or infinite, more than max_skipped_steps={self.max_skipped_steps}: lower "
                f"optimizer.lr or grad_clip_norm, or check the data")
        if flag.item():
            lrs = ", ".join(f"{opt.param_groups[0]['lr']:g}" for opt in optimizers)
            first = self.finite_until + 1
            where = f"at batch {batch}" if first >= batch else f"between batch {first} and batch {batch}"
            raise NonFiniteError(
                f"the loss, gradient norm or weights became NaN or infinite {where} (learning rate {lrs}); the "
                f"run is stopped without saving these weights: lower optimizer.lr or grad_clip_norm, or check "
                f"the data")
        self._flag, self.finite_until = None, batch
