"""A tiny Lightning run for test_lightning.py: fits a small regression model on CPU, saving a
checkpoint every step with ModelCheckpoint, optionally killing itself (SIGKILL) after a step.

    python lightning_run.py DIR MAX_STEPS [--io tpde|native|async|torch] [--kill-after N]
                            [--resume CKPT] [--weights OUT.safetensors] [--top-k K]
"""
import argparse
import os
import signal

import lightning as L
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, width: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)]


class KillAfter(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step == self.step:
            io = trainer.strategy.checkpoint_io
            io.teardown()  # the saves queued so far are on disk
            getattr(io, "checkpoint_io", io).teardown()  # and their rewrites (AsyncCheckpointIO's stops at its own)
            os.kill(os.getpid(), signal.SIGKILL)


def data():
    # 5 batches an epoch, in a fixed order: a checkpoint at an epoch's end resumes exactly
    # (mid-epoch, Lightning restarts the epoch's data: not exact with any CheckpointIO).
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 8, generator=g), torch.randn(40, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("max_steps", type=int)
    p.add_argument("--io", default="tpde", choices=["tpde", "native", "async", "torch"])
    p.add_argument("--kill-after", type=int)
    p.add_argument("--resume")
    p.add_argument("--weights")
    p.add_argument("--top-k", type=int, default=-1)
    a = p.parse_args()
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from tpde.lightning import TpdeCheckpointIO

    io = {"tpde": lambda: TpdeCheckpointIO(keyframe_every=3, newest="tpde"),
          "native": lambda: TpdeCheckpointIO(keyframe_every=3),  # the default
          "async": lambda: AsyncCheckpointIO(TpdeCheckpointIO(keyframe_every=3, newest="tpde")),
          "torch": lambda: None}[a.io]()
    torch.manual_seed(0)
    model = Regressor()
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(
        dirpath=a.dir, every_n_train_steps=1, save_top_k=a.top_k, monitor="step" if a.top_k > 0 else None, mode="max",
        # a link to the newest (under AsyncCheckpointIO Lightning links to a file not yet written)
        save_last="link" if a.io != "async" else None)]
    if a.kill_after is not None:
        callbacks.append(KillAfter(a.kill_after))
    trainer = L.Trainer(max_steps=a.max_steps, callbacks=callbacks, plugins=[io] if io else None, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", deterministic=True)
    trainer.fit(model, data(), ckpt_path=a.resume)
    if a.weights:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, a.weights)


if __name__ == "__main__":
    main()
